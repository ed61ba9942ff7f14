"""When a DRA partition's use ends: the ResourceClaim's lifetime, not a Pod's (docs/contract.md 11).

A ResourceClaim may be reserved for several Pods (`status.reservedFor` lists them all). Kubelet
prepares it once per node, keeps the set of Pods using it, and calls NodeUnprepareResources only
when the last of them is gone (k8s.io/kubernetes pkg/kubelet/cm/dra/manager.go:
`addPodReference` / `deletePodReference`, `hasPodReference`). The resourceclaim controller
removes finished Pods from `reservedFor` and deallocates a claim reserved for nobody, or deletes
one a template made (pkg/controller/resourceclaim/controller.go). So a claim's partition is
released when

- the ResourceClaim is deleted (not found, or the name now has another UID): a claim is deleted
  only once nothing is reserved for it (its `delete-protection` finalizer), so nothing uses the
  partition; or
- kubelet has unprepared it on this node (`unprepared_at`, recorded by the preparer) and the
  claim's allocation no longer names this device in this node's pool.

`ending` decides that, pure; `ClaimEnds` reads the claims and asks the API server about every
DRA claim each `PK_RESYNC_SECONDS`, and about the unprepared ones on every unprepare and, while
one still waits for its deallocation, whenever the ResourceClaim watch (claimwatch.py) sees a
change of a claim it holds; while that watch is down, at every change the allocator sees and
with backoff. The
Pod that happened to be first in `reservedFor` decides nothing, and the reclaimer leaves DRA
claims to this (services/reclaimer/decide.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from partkeeper import backoff
from partkeeper.claims import StoreReadError, TransitionError
from partkeeper.dra import DRIVER
from partkeeper.lifecycle import woken_or_timeout
from schemas import Claim
from services.allocator.core import reclaimer, writes
from services.allocator.core.state import Context
from services.allocator.dra.kube import KubeError, ResourceApi

log = logging.getLogger(__name__)

# With the ResourceClaim watch up, an unprepared claim is looked at again when the watch sees it
# change; this bounds how long a lost event could hold a release back.
WATCHED_RECHECK_SECONDS = 2.0


def allocated_here(body: dict[str, Any], device: str, node: str) -> bool:
    allocation = (body.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return any(r.get("driver") == DRIVER and r.get("pool") == node and r.get("device") == device
               for r in results if isinstance(r, dict))


def ending(claim: Claim, body: dict[str, Any] | None, node: str) -> str | None:
    """Why the partition of `claim` may go now, or None while its ResourceClaim still uses it.
    `body` is the ResourceClaim as the API server answers, None when it is not found."""
    if not claim.resource_claim_uid or claim.state == "releasing":
        return None
    if body is None:
        return f"ResourceClaim {claim.resource_claim} was deleted"
    if (body.get("metadata") or {}).get("uid") != claim.resource_claim_uid:
        return (f"ResourceClaim {claim.resource_claim} was deleted (the name now has UID "
                f"{(body.get('metadata') or {}).get('uid')})")
    device = claim.device_ids[0] if claim.device_ids else ""
    if claim.unprepared_at and not allocated_here(body, device, node):
        return (f"ResourceClaim {claim.resource_claim} was unprepared on this node and is no "
                f"longer allocated device {device} here")
    return None


class ClaimEnds:
    def __init__(self, ctx: Context, api: ResourceApi) -> None:
        self.ctx = ctx
        self.api = api
        self.released = 0
        self._wake = asyncio.Event()
        self.held: frozenset[str] = frozenset()  # ResourceClaim UIDs with a partition here
        self.watched: Callable[[], bool] = lambda: False  # the ResourceClaim watch is up

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        waiting = 0  # passes in a row that left an unprepared claim allocated
        full_at = 0.0
        while True:
            self._wake.clear()
            change = self.ctx.changes.next_change()
            full = loop.time() >= full_at
            if full:
                full_at = loop.time() + self.ctx.config.resync_seconds
            pending = await self.once(full=full)
            if not pending:
                waiting = 0
                await woken_or_timeout(self._wake, full_at - loop.time())
                continue
            # An unprepared claim waits for the resourceclaim controller to deallocate or delete
            # it: the ResourceClaim watch wakes this when it does. Without the watch, ask again
            # soon, and at every change the allocator sees (the Pod's end reaches the Pod view
            # about then).
            waiting += 1
            if self.watched():
                await woken_or_timeout(self._wake, WATCHED_RECHECK_SECONDS)
            else:
                await woken_or_timeout(change, backoff.delay(waiting, base=0.02, cap=2.0))

    async def once(self, *, full: bool = True) -> bool:
        """One pass over the unprepared claims (all DRA claims when `full`: a claim deleted
        without kubelet's unprepare, or written by an older version, is found by that); True
        when an unprepared claim is still allocated (look again soon)."""
        try:
            docs = await self.ctx.store.read_all([c.index for c in self.ctx.cards])
        except StoreReadError as exc:
            log.warning("DRA claim lifetimes not checked (%s); again next pass", exc)
            return True
        pending = False
        self.held = frozenset(c.resource_claim_uid for doc, _ in docs.values()
                              for c in doc.claims.values() if c.resource_claim_uid)
        for doc, _ in docs.values():
            for claim in doc.claims.values():
                if not claim.resource_claim_uid or claim.state == "releasing":
                    continue
                if not (full or claim.unprepared_at):
                    continue
                try:
                    body = await self._claim(claim)
                except KubeError as exc:
                    log.warning("claim %s: reading %s failed (%s); kept, again next pass",
                                claim.id, claim.resource_claim, exc)
                    pending = pending or bool(claim.unprepared_at)
                    continue
                reason = ending(claim, body, self.ctx.node)
                if reason is None:
                    pending = pending or bool(claim.unprepared_at)
                    continue
                try:
                    await writes.release(self.ctx, claim, reason)
                    self.released += 1
                except (TransitionError, StoreReadError) as exc:
                    log.info("claim %s not released now (%s); again next pass", claim.id, exc)
                    continue
                # Destroyed now rather than at the reclaimer's next reconcile pass, and the room
                # published at once (the claims watch would tell the publisher a little later).
                if await reclaimer.reclaim(self.ctx, [claim.id], reason):
                    self.ctx.changes.touch()
        return pending

    async def _claim(self, claim: Claim) -> dict[str, Any] | None:
        namespace, _, name = claim.resource_claim.partition("/")
        try:
            body = await self.api.get_claim(namespace, name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return body if isinstance(body, dict) else None
