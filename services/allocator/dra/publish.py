"""Keeping the node's ResourceSlices equal to what the claims and the hardware leave free.

Woken by every change the allocator sees (claims bucket, Pod view, hardware poll; the wake-ups
carry no data), a pass reads a fresh snapshot, computes the pool (`partkeeper.dra.slices`, pure)
and writes only what differs: every slice at the new generation first, then the slices the pool
no longer has are deleted, so a consumer that sees a mix takes the newer, complete generation. A
failed read of the claims or the hardware keeps the published slices (nothing is concluded from
a partial read), and a failed write re-lists before the next try.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from partkeeper.bus import backoff
from partkeeper.dra import slices
from partkeeper.lifecycle import woken_or_timeout
from partkeeper.telemetry.logs import decision
from services.allocator.context import Context
from services.allocator.dra.kube import KubeError, ResourceApi
from services.allocator.snapshot import SnapshotError, read

log = logging.getLogger(__name__)


class SlicePublisher:
    def __init__(self, ctx: Context, api: ResourceApi) -> None:
        self.ctx = ctx
        self.api = api
        self.current: list[dict[str, Any]] | None = None  # as the server last answered
        self.generation = 0
        self.publishes = 0  # passes that wrote something (tests, bench)
        self.failures = 0

    async def run(self, first: asyncio.Event) -> None:
        """Publish on every change until cancelled; `first` is set after the first good pass."""
        while True:
            change = self.ctx.changes.next_change()
            if await self.once():
                self.failures = 0
                first.set()
                await change.wait()
            else:
                self.failures += 1
                await woken_or_timeout(change, backoff.delay(self.failures, cap=5.0))

    async def once(self) -> bool:
        try:
            snap = await read(self.ctx)
        except SnapshotError as exc:
            log.warning("ResourceSlices not recomputed (%s); the published ones stay", exc)
            return False
        desired = slices.pool(self.ctx.node, list(self.ctx.cards), snap.claims,
                              snap.all_instances)
        try:
            await self._sync(desired)
        except KubeError as exc:
            self.current = None
            log.warning("publishing the ResourceSlices failed (%s); again soon", exc)
            return False
        return True

    async def _sync(self, desired: slices.Pool) -> None:
        if self.current is None:
            self.current = await self.api.list_slices()
        generation = slices.generation(self.current, desired)
        if self.current and generation == _generation(self.current):
            return
        wanted = slices.slices(desired, generation)
        have = {s["metadata"]["name"]: s for s in self.current}
        written = []
        for body in wanted:
            old = have.get(body["metadata"]["name"])
            if old is None:
                written.append(await self.api.create_slice(body))
            else:
                version = old["metadata"].get("resourceVersion")
                body["metadata"]["resourceVersion"] = version
                written.append(await self.api.replace_slice(body))
        keep = {b["metadata"]["name"] for b in wanted}
        for name in sorted(set(have) - keep):
            await self.api.delete_slice(name)
        self.current, self.generation = written, generation
        self.publishes += 1
        decision(log, f"published {len(wanted)} ResourceSlices at generation {generation} "
                 f"({len(desired.devices)} devices free)", node=self.ctx.node)


def _generation(objects: list[dict[str, Any]]) -> int:
    return max((int(o["spec"]["pool"]["generation"]) for o in objects), default=0)
