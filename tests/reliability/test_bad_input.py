"""Garbage on every subject the services consume (invariant 10), with the whole stack running.

Stream subjects (`pk.pods.<node>.*`, read by the reclaimer and the GC; `pk.parts.<node>.*`, read
by the watcher's Event recorder): every undecodable message is copied to PK_DLQ by each consumer,
with headers naming the original subject and sequence. Request subjects (pods.get, pods.pending,
claims.query, reclaim.now): every garbage request gets an error reply. Afterwards every service
is still up and a Pod is admitted and reclaimed as usual; a planted file outside PK_PODS_DIR,
named by a path-trick "UID", is untouched.
"""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from reliability.rel_harness import Scene, scene

from partkeeper.bus.rpc import ERROR_CODE_HEADER
from partkeeper.stack.launch import MICRO_SERVICES, SERVICES, service_ready
from schemas import PodGone
from schemas.names import (
    STREAM_DLQ,
    STREAM_PARTITIONS,
    STREAM_PODS,
    claims_query_subject,
    dlq_subject,
    encode_token,
    pods_get_subject,
    pods_pending_subject,
    reclaim_now_subject,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

DLQ_SECONDS = 30.0
READERS = {STREAM_PODS: ("reclaimer", "gc"), STREAM_PARTITIONS: ("watcher",)}


def garbage() -> list[bytes]:
    """Payloads no decoder may accept: not JSON, wrong shapes, versions, tags and fields."""
    return [
        b"", b"\x00\xff\xfe", b"not json", b"[1, 2, 3]", b"null", b'"PodGone"', b"{",
        b'{"v": 1}', b'{"type": "PodGone"}', b'{"v": 999, "type": "PodGone"}',
        b'{"v": "1", "type": "PodGone"}', b'{"v": true, "type": "PodGone"}',
        b'{"v": 1, "type": "NoSuchEvent", "uid": "x"}',
        b'{"v": 1, "type": "PodGone", "uid": 7}',
        b'{"v": 1, "type": "ClaimChanged", "card": "zero"}',
        json.dumps({"v": 1, "type": "PodSeen", "phase": "Exploded", "node": "n", "uid": "u",
                    "namespace": "d", "name": "p", "resource_version": "1",
                    "observed_at": 0}).encode(),
        b"\xef\xbb\xbf" + b'{"v": 1}', b"{" * 5000,
    ]


def path_trick(node: str) -> bytes:
    """A well-formed PodGone whose UID tries to name a path outside PK_PODS_DIR."""
    event = PodGone(node=node, uid="../outside", namespace="default", name="x",
                    resource_version="1", observed_at=time.time(), evidence="deleted")
    return msgspec.json.encode(event)


async def publish_all(js: JetStreamContext, subject: str, bodies: list[bytes], tag: str) -> set[int]:
    seqs = set()
    for i, body in enumerate(bodies):
        ack = await js.publish(subject, body, headers={"Nats-Msg-Id": f"garbage/{tag}/{i}"})
        seqs.add(ack.seq)
    return seqs


async def dead_letters(js: JetStreamContext, node: str, service: str, stream: str) -> set[int]:
    """Original sequences of `stream` that `service` dead-lettered."""
    found: set[int] = set()
    sub = await js.subscribe(dlq_subject(node, service), ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except TimeoutError:
                return found
            headers = msg.headers or {}
            if headers.get("Pk-Original-Stream") == stream:
                found.add(int(headers["Pk-Original-Sequence"]))
    finally:
        await sub.unsubscribe()


async def all_dead_lettered(sc: Scene, stream: str, seqs: set[int]) -> None:
    js, node = sc.rig.stack.nc.jetstream(), sc.rig.stack.node
    end = time.monotonic() + DLQ_SECONDS
    for service in READERS[stream]:
        while (missing := seqs - await dead_letters(js, node, service, stream)):
            assert time.monotonic() < end, (
                f"{service} did not dead-letter {stream} seqs {sorted(missing)}\n"
                f"{sc.logs([service])}")
            await asyncio.sleep(0.2)  # asked again until the deadline


async def error_replies(nc: Client, node: str) -> dict[str, list[str]]:
    """Each request subject with each garbage body: the error code of each reply."""
    subjects = [pods_get_subject(node), pods_pending_subject(node), claims_query_subject(node),
                reclaim_now_subject(node)]
    codes: dict[str, list[str]] = {}
    for subject in subjects:
        for body in garbage():
            msg = await nc.request(subject, body, timeout=5.0)
            codes.setdefault(subject, []).append((msg.headers or {}).get(ERROR_CODE_HEADER, ""))
    return codes


async def test_garbage_on_every_consumed_subject() -> None:
    async with scene() as sc:
        nc, node = sc.rig.stack.nc, sc.rig.stack.node
        js = nc.jetstream()
        outside = sc.rig.layout.root / "outside"
        outside.mkdir()
        (outside / "keep").write_text("not partkeeper's")
        token = encode_token(node)
        pods = await publish_all(js, f"pk.pods.{token}.garbage", garbage(), "pods")
        pods |= await publish_all(js, f"pk.pods.{token}.trick", [path_trick(node)], "trick")
        parts = await publish_all(js, f"pk.parts.{token}.0", garbage(), "parts")
        codes = await error_replies(nc, node)
        assert all(code == "400" for found in codes.values() for code in found), codes
        await all_dead_lettered(sc, STREAM_PODS, pods - await harmless(js, pods))
        await all_dead_lettered(sc, STREAM_PARTITIONS, parts)
        for name in SERVICES:
            assert sc.rig.alive(name), sc.logs([name])
            if name in MICRO_SERVICES:
                await asyncio.wait_for(service_ready(nc, name), 10.0)
        pod = await sc.admit("1g.10gb", "after")
        await sc.work.delete(pod)
        await sc.check_converged()
        assert (outside / "keep").read_text() == "not partkeeper's"
        info = await js.stream_info(STREAM_DLQ)
        assert info.state.messages >= len(pods) + len(parts)


async def harmless(js: JetStreamContext, seqs: set[int]) -> set[int]:
    """None: even the path-trick event, well formed, must be refused (dead-lettered) by both
    readers, because its UID is not a Pod UID. Kept as a function so the expectation is named."""
    return set()
