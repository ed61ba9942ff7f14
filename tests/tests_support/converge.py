"""The convergence check every reliability scenario and the soak end with.

Three independent sources are read afresh: the API server's Pods, the claims in `pk-claims`, and
the simulated cards (plus the per-Pod working directories). `problems()` is a pure function of
that snapshot; the node has converged when it finds nothing:

- no claim `creating` or `releasing` is left;
- no claim belongs to a Pod that is not live (a Pod deleted or finished whose claim is never
  released is a lost event);
- no instance on the cards lacks a claim of a live Pod (a leak), foreign ones given aside;
- every live Pod that was admitted (phase Running) holds, per partkeeper resource it asks for,
  that many active claims, and each partition claim's instance exists (no claim lost, nothing
  destroyed under it);
- no working directory is left for a Pod that is not live.

A read that fails is retried until the deadline; it is never taken as "nothing there".
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from partkeeper.claims import ClaimsStore
from partkeeper_sim.driver import SimDriver
from schemas import Claim

LIVE_PHASES = ("Pending", "Running")
RECHECK_SECONDS = 0.25


class NotConverged(AssertionError):
    """The deadline passed with problems left; the message lists them."""


@dataclass(frozen=True, slots=True)
class PodFact:
    uid: str
    namespace: str
    name: str
    phase: str
    requests: dict[str, int]  # partkeeper resources -> quantity, over all containers

    @property
    def live(self) -> bool:
        return self.phase in LIVE_PHASES  # terminating Pods are live

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid}, {self.phase})"


@dataclass(frozen=True, slots=True)
class Snapshot:
    pods: dict[str, PodFact]
    claims: list[Claim]
    instances: dict[str, dict[str, Any]]  # MIG UUID -> the sim's instance, with its card
    workdirs: list[str]  # Pod UIDs with a directory under PK_PODS_DIR


def problems(snap: Snapshot, *, foreign: Collection[str] = (),
             resources: Callable[[str], bool] = lambda _r: True) -> list[str]:
    """Everything that keeps the node from having converged (empty: converged). Pure."""
    found: list[str] = []
    live = {uid: pod for uid, pod in snap.pods.items() if pod.live}
    for claim in snap.claims:
        owner = f"Pod {claim.namespace}/{claim.name} ({claim.pod_uid})"
        if claim.state in ("creating", "releasing"):
            found.append(f"claim {claim.id} of {owner} is still {claim.state}")
        elif claim.pod_uid not in live:
            state = snap.pods[claim.pod_uid].phase if claim.pod_uid in snap.pods else "deleted"
            found.append(f"claim {claim.id} of {owner} is {claim.state} but the Pod is {state}")
    owners = {c.instance.uuid: c for c in snap.claims if c.instance is not None}
    for uuid, inst in sorted(snap.instances.items()):
        where = f"instance {uuid} ({inst.get('profile')} at card {inst.get('card')} " \
                f"start {inst.get('start')})"
        holder = owners.get(uuid)
        if uuid in foreign:
            continue
        if holder is None:
            found.append(f"{where} has no claim (leaked)")
        elif holder.pod_uid not in live:
            found.append(f"{where} belongs to claim {holder.id} of a Pod that is not live")
    for pod in live.values():
        if pod.phase == "Running":
            found.extend(_held(pod, snap, resources))
    found.extend(f"working directory of Pod {uid} is left, the Pod is not live"
                 for uid in snap.workdirs if uid not in live)
    return found


def _held(pod: PodFact, snap: Snapshot, resources: Callable[[str], bool]) -> list[str]:
    """What an admitted Pod lacks: an active claim per device, each partition's instance."""
    lacking = []
    mine = [c for c in snap.claims if c.pod_uid == pod.uid and c.state == "active"]
    for resource, quantity in sorted(pod.requests.items()):
        if not resources(resource):
            continue
        held = [c for c in mine if c.resource == resource]
        if len(held) != quantity:
            lacking.append(f"Pod {pod.label} asks {quantity} {resource} and has {len(held)} "
                           "active claim(s) (a claim lost)")
        lacking.extend(
            f"Pod {pod.label} lost its partition "
            f"{c.instance.uuid if c.instance else '(none recorded)'} (claim {c.id} active)"
            for c in held
            if c.kind == "partition" and (c.instance is None or c.instance.uuid not in
                                          snap.instances)
        )
    return lacking


class Reader:
    """Reads a `Snapshot` of one node: Pods (all namespaces), claims, sim cards, workdirs."""

    def __init__(self, api: client.CoreV1Api, store: ClaimsStore, sim_state: Path,
                 pods_dir: Path, node: str) -> None:
        self.api = api
        self.store = store
        self.driver = SimDriver(sim_state)
        self.pods_dir = pods_dir
        self.node = node

    async def snapshot(self) -> Snapshot:
        pods = await asyncio.to_thread(self._pods)
        docs = await self.store.read_all()
        claims = [c for doc, _ in docs.values() for c in doc.claims.values()]
        sim = await asyncio.to_thread(self.driver.list)
        instances = {i["uuid"]: {**i, "card": card["index"]}
                     for card in sim["cards"] for i in card["instances"]}
        workdirs = await asyncio.to_thread(self._workdirs)
        return Snapshot(pods, claims, instances, workdirs)

    def _pods(self) -> dict[str, PodFact]:
        resp = self.api.list_pod_for_all_namespaces(_preload_content=False,
                                                    _request_timeout=10)
        return {fact.uid: fact for fact in map(pod_fact, json.loads(resp.data)["items"])}

    def _workdirs(self) -> list[str]:
        try:
            return sorted(e for e in os.listdir(self.pods_dir) if not e.startswith("."))
        except FileNotFoundError:
            return []


def pod_fact(item: dict[str, Any]) -> PodFact:
    meta, spec = item.get("metadata") or {}, item.get("spec") or {}
    requests: dict[str, int] = {}
    for container in spec.get("containers") or []:
        res = container.get("resources") or {}
        asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for name, value in asked.items():
            if "/" in name:  # extended resources only (cpu and memory have no prefix)
                requests[name] = requests.get(name, 0) + int(value)
    return PodFact(str(meta.get("uid", "")), str(meta.get("namespace", "")),
                   str(meta.get("name", "")), str((item.get("status") or {}).get("phase", "")),
                   requests)


async def converged(
    read: Callable[[], Awaitable[Snapshot]], *, deadline: float, foreign: Collection[str] = (),
    resources: Callable[[str], bool] = lambda _r: True, context: Callable[[], str] = str,
) -> Snapshot:
    """Wait until `problems()` finds nothing; NotConverged with the last ones after `deadline`
    seconds. `context()` adds to the failure message (e.g. the tails of the services' logs)."""
    end = time.monotonic() + deadline
    last: list[str] = ["nothing could be read yet"]
    while True:
        try:
            snap = await read()
        except Exception as exc:  # a failed read proves nothing; read again until the deadline
            last = [f"reading the node failed: {type(exc).__name__}: {exc}"]
        else:
            last = problems(snap, foreign=foreign, resources=resources)
            if not last:
                return snap
        if time.monotonic() > end:
            listed = "\n  ".join(last[:40])
            raise NotConverged(f"not converged after {deadline:.0f}s:\n  {listed}\n{context()}")
        await asyncio.sleep(RECHECK_SECONDS)  # the next fresh read, bounded by the deadline
