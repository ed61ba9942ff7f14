"""NodePrepareResources and NodeUnprepareResources over the claims store (DRA mode).

    read the ResourceClaim (UID, allocation, reserving Pod)  -> per allocated device:
      no claim     -> write `creating` (keyed by claim UID + device) -> create at the allocated
                      placement -> `active` -> CDI spec -> CDI id
      creating     -> adopt the instance a crash left at the spec, or create -> as above
      active       -> the same CDI id again (kubelet retries after restarts)
      rebooted     -> a host reboot removed it: re-made at the same placement (`core.remake`),
                      then as creating
      releasing    -> an error: the claim is on its way out

The claim is durable before the driver is asked (invariant 4), so a crash at any step leaves a
record that the retry completes or the reclaimer removes. Create (or adopt), activate and the
undo on failure are the core's `writes.realise`, the same as device-plugin mode's. A
device's realisation runs in a task that outlives kubelet giving up on the call, so a retry
joins it instead of racing it.

Unprepare never destroys, nor releases: it records that kubelet is done with the claim on this
node (kubelet calls it once the claim's last Pod here is gone, however many Pods share it), and
`ends.py` releases once the claim is deallocated from the node or deleted. The reclaimer alone
destroys, as in device-plugin mode.

Kubelet matches a container's claim request by its top-level name, so every device answers the
request's top-level name: `gpu` for a prioritized-list allocation `gpu/p0` (the upstream
kubeletplugin helper strips subrequests the same way, resourceclaim.BaseRequestRef).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from partkeeper import cdi, faults
from partkeeper.claims import StoreReadError, TransitionError
from partkeeper.claims.store import ConflictExhausted
from partkeeper.dra import DRIVER
from partkeeper.kubelet import dra_pb2 as pb
from partkeeper.telemetry.logs import decision
from schemas import Claim
from services.allocator.core import handoff, remake, writes
from services.allocator.core.placement import Target
from services.allocator.core.refusal import Refusal
from services.allocator.core.state import Context, current_claims
from services.allocator.dra import requests
from services.allocator.dra.kube import KubeError, ResourceApi
from services.allocator.dra.requests import Asked, NotPreparable, Wanted

log = logging.getLogger(__name__)


class PrepareError(Exception):
    """One device of one claim could not be prepared; the message goes to kubelet."""


def new_claim(w: Wanted, now: float) -> Claim:
    return writes.new_claim(
        Target(w.pod_uid, w.asked.namespace, w.pod_name, w.request or "claim"),
        kind="partition", resource=DRIVER, token=w.device, card=w.spec.card,
        profile=w.spec.profile.name, start=w.spec.start, size=w.spec.size, now=now,
        claim_id=w.claim_id, resource_claim=f"{w.asked.namespace}/{w.asked.name}",
        resource_claim_uid=w.asked.uid,
    )


class Preparer:
    def __init__(self, ctx: Context, api: ResourceApi,
                 on_unprepared: Callable[[], None] = lambda: None) -> None:
        self.ctx = ctx
        self.api = api
        self.on_unprepared = on_unprepared  # wakes the claim lifetimes (ends.py)
        self._work: dict[str, asyncio.Task[str]] = {}

    async def close(self) -> None:
        """Let realisations already started finish: they leave the store consistent."""
        await asyncio.gather(*self._work.values(), return_exceptions=True)

    async def prepare(self, ref: pb.Claim) -> pb.NodePrepareResourceResponse:
        with self.ctx.serving():  # the recompute and the audit wait for it (`Context.quiet`)
            return await self._prepare(ref)

    async def _prepare(self, ref: pb.Claim) -> pb.NodePrepareResourceResponse:
        asked = Asked(ref.namespace, ref.uid, ref.name)
        try:
            try:
                body = await self.api.get_claim(ref.namespace, ref.name)
            except KubeError as exc:
                raise PrepareError(f"reading {asked} failed ({exc}); nothing was prepared and "
                                   "kubelet may retry") from exc
            wanted = requests.wanted(body, asked, self.ctx.node, self.ctx.cards)
            found = [(w, await self._device(w)) for w in wanted]
        except (NotPreparable, PrepareError) as exc:
            decision(log, f"NodePrepareResources refused: {exc}", claim_uid=asked.uid)
            return pb.NodePrepareResourceResponse(error=str(exc))
        return pb.NodePrepareResourceResponse(devices=[
            pb.Device(request_names=[requests.top_level(w.request)] if w.request else [],
                      pool_name=self.ctx.node,
                      device_name=w.device, cdi_device_ids=[cid])
            for w, cid in found
        ])

    async def _device(self, w: Wanted) -> str:
        task = self._work.get(w.claim_id)
        if task is None:
            task = asyncio.create_task(self._realise(w), name=f"prepare {w.claim_id}")
            self._work[w.claim_id] = task
            task.add_done_callback(lambda t: self._work.pop(w.claim_id, None))
        return await asyncio.shield(task)

    async def _realise(self, w: Wanted) -> str:
        # The common prepare is a claim this node has never seen: the views' document is
        # enough to plan its write on (`state.Views`). One it holds is judged on a fresh read.
        current = current_claims(self.ctx, w.spec.card)
        if current is not None and w.claim_id in current[0].claims:
            current = None
        try:
            doc, revision = current or await self.ctx.store.read(w.spec.card)
        except StoreReadError as exc:
            raise PrepareError(f"{w.asked}: {exc}; nothing was prepared") from exc
        revisions = writes.Revisions({w.spec.card: doc}, {w.spec.card: revision})  # writes use it
        existing = doc.claims.get(w.claim_id)
        if existing is None and w.spec.card in self.ctx.failed_cards():
            # The scheduler allocated a device of a card that failed since (or that it took
            # despite the taint): nothing new is placed on a failed card (DESIGN.md).
            fault = self.ctx.health.card_fault(w.spec.card)
            why = fault.meaning if fault is not None else "it stopped answering"
            raise PrepareError(f"{w.asked}: device {w.device} is on card {w.spec.card}, which "
                               f"has failed ({why}); nothing was prepared")
        if existing is None:
            claim = new_claim(w, time.time())
            if not await writes.begin(self.ctx, claim, revisions):
                raise PrepareError(f"{w.asked}: device {w.device} overlaps a partition claimed "
                                   "meanwhile; nothing was prepared and kubelet may retry")
            await faults.reach("allocator.after_claim")
            active = await self._made(w, claim, revisions, resume=False)
        elif existing.rebooted and existing.state in ("creating", "active"):
            # kubelet prepares the claim again after a host reboot removed its partition: re-made
            # at the allocated device's placement, the only one the ResourceClaim names.
            decision(log, "prepare after a host reboot re-makes the claim's partition",
                     pod_uid=existing.pod_uid, card=existing.card, claim_id=existing.id)
            until = asyncio.get_running_loop().time() + self.ctx.options.room_wait_seconds
            try:
                [again] = await remake.remake(
                    self.ctx, [existing], {existing.card: ((existing.start, existing.size),)},
                    until)
            except Refusal as exc:
                raise PrepareError(f"{w.asked}: device {w.device}: {exc.message}") from exc
            active = await self._made(w, again, writes.Revisions({}, {}), resume=True)
        elif existing.state == "creating":
            decision(log, "retried prepare completes a creating claim", pod_uid=existing.pod_uid,
                     card=existing.card, claim_id=existing.id)
            active = await self._made(w, existing, revisions, resume=True)
        elif existing.state == "active" and existing.instance is not None:
            if existing.unprepared_at:
                # Unprepared, still allocated, and now a Pod of this node uses it again.
                await writes.unprepared(self.ctx, existing, 0.0, revisions)
            return await self._cdi(existing)
        else:
            raise PrepareError(f"{w.asked}: device {w.device} is {existing.state} "
                               f"({existing.release_reason or 'released'}); it is not prepared "
                               "again")
        cid = await self._cdi(active)
        await faults.reach("allocator.after_active")
        return cid

    async def _made(
        self, w: Wanted, claim: Claim, revisions: writes.Revisions, *, resume: bool
    ) -> Claim:
        """The claim's partition created (or, resuming, adopted) and the claim active, by the
        one realisation both modes use (`writes.realise`: undone on failure); its refusal
        becomes the claim's error for kubelet."""
        try:
            [active] = await writes.realise(self.ctx, [claim], resume=resume,
                                                known=revisions)
        except writes.Displaced as exc:
            raise PrepareError(f"{w.asked}: device {w.device} overlaps a partition made "
                               f"meanwhile ({exc}); nothing was prepared and kubelet may "
                               "retry") from exc
        except Refusal as exc:
            raise PrepareError(f"{w.asked}: {exc.message}") from exc
        return active

    async def _cdi(self, claim: Claim) -> str:
        """The partition's CDI spec, written as device-plugin mode's CDI strategy writes it
        (DRA mode always runs with that strategy); its qualified name."""
        try:
            _, names = await handoff.partition_handoff(self.ctx, [claim])
        except Refusal as exc:
            raise PrepareError(f"{claim.resource_claim}: {exc.message}") from exc
        if not names:
            raise PrepareError(f"claim {claim.id} of {claim.resource_claim} is active without a "
                               "recorded instance; it is left to the reclaimer")
        return names[0]

    async def unprepare(self, ref: pb.Claim) -> pb.NodeUnprepareResourceResponse:
        """Kubelet is done with the claim on this node (its last Pod here is gone): record it
        on every partition of the claim and drop their CDI specs. Nothing is released here:
        the claim may still be allocated, and `ends.ClaimEnds` releases once it is not."""
        asked = Asked(ref.namespace, ref.uid, ref.name)
        try:
            docs = await self.ctx.store.read_all([c.index for c in self.ctx.cards])
        except StoreReadError as exc:
            return pb.NodeUnprepareResourceResponse(error=f"{asked}: {exc}; kubelet may retry")
        mine = [c for doc, _ in docs.values() for c in doc.claims.values()
                if c.resource_claim_uid == ref.uid]
        now = time.time()
        for claim in mine:
            try:
                await writes.unprepared(self.ctx, claim, now)
            except (StoreReadError, ConflictExhausted, TransitionError) as exc:
                return pb.NodeUnprepareResourceResponse(
                    error=f"{asked}: recording the unprepare of claim {claim.id} failed ({exc}); "
                          "kubelet may retry")
            try:
                await asyncio.to_thread(cdi.remove_spec, self.ctx.config.cdi_dir, claim.id)
            except cdi.CdiError as exc:
                log.warning("%s: %s; the reclaimer removes it after the destroy", asked, exc)
        self.on_unprepared()
        return pb.NodeUnprepareResourceResponse()
