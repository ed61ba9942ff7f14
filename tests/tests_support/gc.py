"""Test doubles and helpers of the GC tests: Pod trees, a device seam, pods.get and claims.query
answered from tables by micro services over real NATS, and condition waits with deadlines."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Literal

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.micro.service import Service

import tests_support as support
from partkeeper import bus, workdir
from partkeeper.bus.rpc import Endpoint
from schemas import (
    Claim,
    ClaimsQuery,
    ClaimsReply,
    PodFinished,
    PodGone,
    PodSeen,
    PodsGet,
    PodsGetReply,
    PodsStates,
    PodsStatesReply,
    WorkdirCollected,
    decode,
)
from schemas.names import (
    STREAM_PARTITIONS,
    STREAM_PODS,
    claims_query_subject,
    durable_name,
    gc_parts_subject,
    pods_get_subject,
    pods_states_subject,
    pods_subject,
)
from schemas.pods import PodState


def build_pod(
    root: Path, uid: str, *, descriptor: bool = True, sliced: bool = True, container: str = "main"
) -> Path:
    """A Pod directory as the allocator leaves it: a descriptor and/or an owned sliced tree."""
    if descriptor:
        workdir.write_descriptor(root, uid, container, f"MIG-{uid}", b'{"card": 0}')
    if sliced:
        sliced_dir = workdir.write_sliced(
            root, uid, container, {"limits.json": b'{"memory_mib": 1024}', "cuda.env": b"X=1"}
        )
        (sliced_dir / "cache" / "kernel.bin").write_bytes(b"cached by the workload")
        (sliced_dir / "cache" / "sub").mkdir()
        (sliced_dir / "cache" / "sub" / "more.bin").write_bytes(b"more")
    return root / uid


def device_seam(*dirs: Path) -> workdir.DeviceOf:
    """A device seam: the given directories (by inode) report another filesystem."""
    inodes = {os.stat(d, follow_symlinks=False).st_ino for d in dirs}

    def device_of(st: os.stat_result) -> int:
        return st.st_dev + 1 if st.st_ino in inodes else st.st_dev

    return device_of


class Asked:
    """Counts questions per UID and lets a test wait until one was asked enough times."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._changed = asyncio.Condition()

    async def note(self, uid: str) -> None:
        async with self._changed:
            self.counts[uid] = self.counts.get(uid, 0) + 1
            self._changed.notify_all()

    async def wait(self, uid: str, times: int, timeout: float = 15.0) -> None:
        async def reached() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: self.counts.get(uid, 0) >= times)

        try:
            await asyncio.wait_for(reached(), timeout)
        except TimeoutError:
            got = self.counts.get(uid, 0)
            pytest.fail(f"{uid} was asked {got} time(s), expected {times} within {timeout}s")


class FakeWatcher:
    """pods.get and pods.states from a table: uid -> state (missing: unknown); 'error' answers
    with an error (for pods.states, the whole batch). `batch=False` plays a watcher that predates
    pods.states (services/watcher/states.py): no responder there."""

    def __init__(self, nc: Client, node: str, *, batch: bool = True) -> None:
        self.nc, self.node, self.batch = nc, node, batch
        self.states: dict[str, PodState | Literal["error"]] = {}
        self.asked = Asked()
        self.service: Service | None = None

    async def answer(self, body: PodsGet) -> PodsGetReply:
        await self.asked.note(body.uid)
        state = self.states.get(body.uid, "unknown")
        if state == "error":
            raise RuntimeError("the watcher's test double was told to fail")
        return PodsGetReply(uid=body.uid, state=state, evidence="test table")

    async def answer_many(self, body: PodsStates) -> PodsStatesReply:
        return PodsStatesReply(pods=[await self.answer(PodsGet(uid=uid)) for uid in body.uids])

    async def start(self) -> FakeWatcher:
        endpoints = [Endpoint("pods-get", pods_get_subject(self.node), PodsGet, self.answer)]
        if self.batch:
            endpoints.append(Endpoint("pods-states", pods_states_subject(self.node), PodsStates,
                                      self.answer_many))
        self.service = await bus.serve(
            self.nc, name="pk-watcher", version="0.0.1", description="test double",
            endpoints=endpoints,
        )
        return self

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None


class FakeAllocator:
    """claims.query from a table: uid -> claims (missing: none); `failing` answers with an error."""

    def __init__(self, nc: Client, node: str) -> None:
        self.nc, self.node = nc, node
        self.claims: dict[str, list[Claim]] = {}
        self.failing = False
        self.asked = Asked()
        self.service: Service | None = None

    async def answer(self, body: ClaimsQuery) -> ClaimsReply:
        await self.asked.note(body.pod_uid)
        if self.failing:
            raise RuntimeError("the allocator's test double was told to fail")
        return ClaimsReply(claims=self.claims.get(body.pod_uid, []), revisions={"0": 1})

    async def start(self) -> FakeAllocator:
        self.service = await bus.serve(
            self.nc, name="pk-allocator", version="0.0.1", description="test double",
            endpoints=[
                Endpoint("claims-query", claims_query_subject(self.node), ClaimsQuery, self.answer)
            ],
        )
        return self

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None


def snapshot(top: Path) -> dict[str, bytes | str]:
    """Every entry under `top`: file contents, link targets, and directories, never following."""
    found: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        base = Path(dirpath)
        for name in dirnames + filenames:
            path = base / name
            rel = str(path.relative_to(top))
            if path.is_symlink():
                found[rel] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = path.read_bytes()
    return found




class Canary:
    """A live Pod with a slice: the GC asks about it on every sweep, so its questions count sweeps.

    A sweep asks only after scanning the whole root, so two more questions about the canary mean
    at least one complete sweep looked at every other directory in the meantime.
    """

    def __init__(self, root: Path, watcher: FakeWatcher, uid: str) -> None:
        self.watcher, self.uid = watcher, uid
        build_pod(root, uid, descriptor=False)
        watcher.states[uid] = "live"

    async def sweeps(self, n: int = 2) -> None:
        await self.watcher.asked.wait(self.uid, self.watcher.asked.counts.get(self.uid, 0) + n)


# --- events in, consumer state and audit events out ----------------------------------------------


async def announce(
    js: JetStreamContext, node: str, kind: str, uid: str, *, rv: str = "1", tag: str = ""
) -> int:
    base: dict[str, Any] = dict(node=node, uid=uid, namespace="default", name="p",
                                resource_version=rv, observed_at=time.time())
    event = {
        "PodSeen": lambda: PodSeen(**base, phase="Running"),
        "PodFinished": lambda: PodFinished(**base, phase="Succeeded"),
        "PodGone": lambda: PodGone(**base, evidence="deleted"),
    }[kind]()
    ack = await bus.publish(js, pods_subject(node, uid), event, msg_id=f"{kind}/{uid}/{rv}{tag}")
    return ack.seq


async def consumer_state(js: JetStreamContext, node: str) -> Any:
    return await js.consumer_info(STREAM_PODS, durable_name("gc", node))


async def acked_through(js: JetStreamContext, node: str, seq: int, timeout: float = 15) -> None:
    """Wait until the GC's durable consumer has acknowledged every message up to `seq`."""

    async def acked() -> bool:
        return (await consumer_state(js, node)).ack_floor.stream_seq >= seq

    await support.until(acked, f"the GC acknowledged stream sequence {seq}", timeout)


async def collected_event(js: JetStreamContext, node: str, timeout: float = 15) -> WorkdirCollected:
    found: list[WorkdirCollected] = []

    async def published() -> bool:
        try:
            msg = await js.get_last_msg(STREAM_PARTITIONS, gc_parts_subject(node))
        except NotFoundError:
            return False
        assert msg.data is not None, "the last partitions event has no payload"
        found.append(decode(msg.data, WorkdirCollected))
        return True

    await support.until(published, "a WorkdirCollected event was published", timeout)
    return found[0]
