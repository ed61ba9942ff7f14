"""Keeping the node's ResourceSlices equal to what the claims and the hardware leave free.

Woken by every change the allocator sees (claims bucket, Pod view, hardware poll; the wake-ups
carry no data) and by any change to the node's slices it did not make itself (`SliceWatch`), a
pass reads a fresh snapshot, computes the pool (`partkeeper.dra.slices`, pure) and writes only
what differs: every slice at the new generation first (counter slices before device slices),
then the slices the pool no longer has are deleted, so a consumer that sees a mix takes the
newer, complete generation. What differs is decided on values, not spellings: the server answers
quantities in canonical form (`10240Mi` comes back `10Gi`), so a quiet node writes nothing.

Somebody else may change our slices: kubelet deletes every slice of its node when it starts and
a driver's slices once its plugin has been unusable for 30 s (k8s.io/kubernetes
pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go, `wipeResourceSlices`). As the upstream
`resourceslice` controller (k8s.io/dynamic-resource-allocation/resourceslice) does, we watch the
node's slices and publish again when one changes under us.

With the feature gate `DRAPartitionableDevices` off on the API server (the default on 1.34 and
1.35) the server drops `sharedCounters` and `consumesCounters` without an error; every placement
would then look independent and the scheduler would hand out overlapping ones. The first slice
written holds only counters, so the answer shows it before any device is published: the pass
withdraws every slice, says so once, and the allocator stays not ready (`gate_off`).

A failed read of the claims or the hardware keeps the published slices (nothing is concluded from
a partial read), and a failed write re-lists before the next try.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from partkeeper import backoff
from partkeeper.dra import slices
from partkeeper.telemetry.logs import decision
from services.allocator.core.placement import Snapshot
from services.allocator.core.state import Context, SnapshotError, read
from services.allocator.dra.kube import KubeError, ResourceApi

log = logging.getLogger(__name__)

GATE_OFF = (
    "the API server dropped sharedCounters/consumesCounters from our ResourceSlices: the "
    "feature gate DRAPartitionableDevices is off on kube-apiserver (enable it there and on "
    "kube-scheduler; Kubernetes 1.35+ in docs/dra.md); every device is withdrawn and the "
    "allocator stays not ready"
)
GATE_RETRY_SECONDS = 60.0


class GateOff(Exception):
    """The server's answer lacks the counter fields we sent."""


def counters_dropped(sent: dict[str, Any], answer: Any) -> bool:
    """Whether the server's answer lost the partitionable-device fields of `sent`."""
    spec = sent.get("spec") or {}
    got = (answer.get("spec") if isinstance(answer, dict) else None) or {}
    if spec.get("sharedCounters") and not got.get("sharedCounters"):
        return True
    consuming = {d["name"] for d in spec.get("devices") or [] if d.get("consumesCounters")}
    kept = {d.get("name") for d in got.get("devices") or [] if d.get("consumesCounters")}
    return bool(consuming - kept)


class SlicePublisher:
    def __init__(self, ctx: Context, api: ResourceApi, *, taints: bool = False) -> None:
        self.ctx = ctx
        self.api = api
        self.taints = taints  # the server keeps device taints (versions.taints)
        self.current: list[dict[str, Any]] | None = None  # as the server last answered
        self.stale = False  # somebody else changed our slices: list them again first
        # name -> the body last sent (before the write), so the watch tells ours from others'.
        self.intended: dict[str, dict[str, Any]] = {}
        self.owner: dict[str, Any] | None = None
        self.generation = 0
        self.publishes = 0  # passes that wrote something (tests, bench)
        self.writes = 0  # slices created, replaced or deleted (tests, bench)
        self.failures = 0
        self.gate_off = False

    def invalidate(self) -> None:
        """Our slices changed under us: the next pass lists them before deciding."""
        self.stale = True
        self.ctx.changes.touch()

    async def run(self, first: asyncio.Event) -> None:
        """Publish on every change until cancelled; `first` is set after the first good pass.
        A failed pass is tried again with backoff (slower while the feature gate is off), or
        sooner on the next change."""

        async def publish() -> backoff.Again | None:
            if not await self.once():
                self.failures += 1
                return backoff.Again("the published ResourceSlices stay as they are")
            self.failures = 0
            first.set()
            return None

        await backoff.every("publishing the ResourceSlices", None, publish,
                            wakeup=self.ctx.changes.next_change, schedule=self._retry_delay)

    def _retry_delay(self, failures: int) -> float:
        return backoff.delay(failures, cap=GATE_RETRY_SECONDS if self.gate_off else 5.0)

    async def once(self) -> bool:
        try:
            snap = await read(self.ctx)
        except SnapshotError as exc:
            log.warning("ResourceSlices not recomputed (%s); the published ones stay", exc)
            return False
        try:
            if self.owner is None or self.stale:
                # Read again after a foreign change: a Node deleted and re-created has a new
                # UID, and the garbage collector deletes slices owned by the old one.
                self.owner = await self.api.node_owner()
            desired = slices.pool(self.ctx.node, list(self.ctx.cards), snap.claims,
                                  snap.all_instances, owner=self.owner,
                                  failed=failed_causes(snap), taints=self.taints)
            await self._sync(desired)
        except GateOff:
            await self._withdraw()
            return False
        except KubeError as exc:
            self.current = None
            log.warning("publishing the ResourceSlices failed (%s); again soon", exc)
            return False
        if self.gate_off:
            log.info("the API server keeps our counters again: DRAPartitionableDevices is on")
            self.gate_off = False
        return True

    async def _withdraw(self) -> None:
        if not self.gate_off:
            log.error("%s", GATE_OFF)
            self.gate_off = True
        self.current = None
        self.intended.clear()
        try:
            for obj in await self.api.list_slices():
                await self.api.delete_slice(obj["metadata"]["name"])
                self.writes += 1
        except KubeError as exc:
            log.warning("withdrawing the ResourceSlices failed (%s); again soon", exc)

    async def _sync(self, desired: slices.Pool) -> None:
        if self.current is None or self.stale:
            self.stale = False
            self.current = await self.api.list_slices()
        generation = slices.generation(self.current, desired)
        if self.current and generation == _generation(self.current):
            return
        wanted = slices.slices(desired, generation)
        have = {s["metadata"]["name"]: s for s in self.current}
        written = []
        for body in wanted:
            old = have.get(body["metadata"]["name"])
            self.intended[body["metadata"]["name"]] = body
            if old is None:
                answer = await self.api.create_slice(body)
            else:
                body["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                answer = await self.api.replace_slice(body)
            self.writes += 1
            written.append(answer)
            if counters_dropped(body, answer):
                raise GateOff
        keep = {b["metadata"]["name"] for b in wanted}
        for name in sorted(set(have) - keep):
            self.intended.pop(name, None)
            await self.api.delete_slice(name)
            self.writes += 1
        self.current, self.generation = written, generation
        self.publishes += 1
        decision(log, f"published {len(wanted)} ResourceSlices at generation {generation} "
                 f"({len(desired.devices)} devices free)", node=self.ctx.node)


def failed_causes(snap: Snapshot) -> dict[int, str]:
    """Card -> cause, for the cards that take nothing new (the taint's value)."""
    causes = {}
    for card in snap.failed:
        fault = snap.health.card_fault(card)
        causes[card] = fault.cause if fault is not None else "lost"
    return causes


def _generation(objects: list[dict[str, Any]]) -> int:
    return max((int(o["spec"]["pool"]["generation"]) for o in objects), default=0)
