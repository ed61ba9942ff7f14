"""`pk.<node>.reclaim.now`: the allocator asks for named claims' partitions to be destroyed at once.

Only claims that are reclaimable now (`partkeeper.podstate.reclaimable_now`, the definition the
allocator's room plan uses too): `releasing` ones, and `active` or stale `creating` ones whose Pod
the watcher confirms, freshly, to be gone or finished; everything else is refused with a sentence
saying why, and nothing is touched.
The destroy runs through the same jobs as the Pod-event path, so a later event for the Pod finds
the claim gone and has nothing left to do.
"""

from __future__ import annotations

import logging
import time

from partkeeper.claims import StoreReadError
from partkeeper.drivers.base import DriverError
from partkeeper.podstate import reclaimable_now
from partkeeper.telemetry.logs import decision
from schemas import Claim, ReclaimNow, ReclaimNowReply, ReclaimOutcome
from services.reclaimer.context import Context
from services.reclaimer.decide import KNOWN_STATES
from services.reclaimer.jobs import Job, Jobs
from services.reclaimer.pods import Evidence, ask

log = logging.getLogger(__name__)


class ReclaimNowHandler:
    def __init__(self, ctx: Context, jobs: Jobs) -> None:
        self.ctx = ctx
        self.jobs = jobs

    async def __call__(self, req: ReclaimNow) -> ReclaimNowReply:
        wanted = list(dict.fromkeys(req.claim_ids))
        try:
            index = {c.id: c for c in await self.ctx.claims()}
        except (StoreReadError, DriverError) as exc:
            why = f"the claims could not be read ({exc}); nothing was destroyed"
            return ReclaimNowReply(outcomes=[ReclaimOutcome(claim_id=c, done=False, reason=why)
                                             for c in wanted])
        refused: dict[str, str] = {}
        started: dict[str, Job] = {}
        pods: dict[str, Evidence] = {}
        for cid in wanted:
            claim = index.get(cid)
            why = await self._refusal(claim, cid, pods)
            if why:
                refused[cid] = why
                continue
            assert claim is not None
            started[cid] = self.jobs.ensure(claim.card, cid, pods[claim.pod_uid], urgent=True)
        if started:
            await self.jobs.wait_idle(list(started.values()), self.ctx.tuning.now_wait)
        outcomes = [self._outcome(cid, refused.get(cid), started.get(cid), index.get(cid))
                    for cid in wanted]
        return ReclaimNowReply(outcomes=outcomes)

    async def _refusal(self, claim: Claim | None, cid: str, pods: dict[str, Evidence]) -> str:
        if claim is None:
            return f"claim {cid} is not on this node"
        if claim.state not in KNOWN_STATES:
            return f"claim {cid} is in unknown state {claim.state!r}; it is left alone"
        if claim.resource_claim_uid:
            # DRA mode: the ResourceClaim's end decides (decide.py), never its first Pod's.
            pods.setdefault(claim.pod_uid, Evidence("unknown", "DRA: the ResourceClaim decides"))
            if claim.state == "releasing":
                return ""
            return (f"claim {cid} belongs to ResourceClaim {claim.resource_claim}, which is "
                    "still in use on this node; its partition stays")
        if claim.pod_uid not in pods:
            pods[claim.pod_uid] = await ask(self.ctx.nc, self.ctx.node, claim.pod_uid,
                                            fresh=True, timeout=self.ctx.tuning.watcher_timeout)
        evidence = pods[claim.pod_uid]
        timeout = self.ctx.tuning.create_timeout
        if reclaimable_now(claim, pod_dead=evidence.dead, now=time.time(),
                           create_timeout=timeout):
            return ""
        if not evidence.dead:
            return (f"Pod {claim.pod_uid} of claim {cid} is not confirmed gone or finished "
                    f"({evidence.reason}); its partition stays")
        return (f"claim {cid} of Pod {claim.pod_uid} is creating and younger than {timeout:.0f}s: "
                "the Allocate that wrote it may still be creating, and undoes it itself")

    def _outcome(
        self, cid: str, refusal: str | None, job: Job | None, claim: Claim | None
    ) -> ReclaimOutcome:
        fields = {"claim_id": cid, "card": claim.card if claim else None,
                  "pod_uid": claim.pod_uid if claim else None}
        if refusal or job is None:
            decision(log, "reclaim.now refused", why=refusal, **fields)
            return ReclaimOutcome(claim_id=cid, done=False, reason=refusal or "not started")
        if job.resolved:
            decision(log, "reclaim.now done", **fields)
            return ReclaimOutcome(claim_id=cid, done=True, reason="destroyed and removed")
        why = f"not destroyed yet: {job.last}"
        decision(log, "reclaim.now pending", why=why, **fields)
        return ReclaimOutcome(claim_id=cid, done=False, reason=why)
