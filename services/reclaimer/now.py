"""`pk.<node>.reclaim.now`: the allocator asks for named claims' partitions to be destroyed at once.

Only claims that are `active` or `releasing` and whose Pod the watcher confirms, freshly, to be
gone or finished; everything else is refused with a sentence saying why, and nothing is touched.
The destroy runs through the same jobs as the Pod-event path, so a later event for the Pod finds
the claim gone and has nothing left to do.
"""

from __future__ import annotations

import logging

from partkeeper.claims import StoreReadError
from partkeeper.drivers.base import DriverError
from partkeeper.telemetry.logs import decision
from schemas import Claim, ReclaimNow, ReclaimNowReply, ReclaimOutcome
from services.reclaimer.context import Context
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
            await self.jobs.settle(list(started.values()), self.ctx.tuning.now_wait)
        outcomes = [self._outcome(cid, refused.get(cid), started.get(cid), index.get(cid))
                    for cid in wanted]
        return ReclaimNowReply(outcomes=outcomes)

    async def _refusal(self, claim: Claim | None, cid: str, pods: dict[str, Evidence]) -> str:
        if claim is None:
            return f"claim {cid} is not on this node"
        if claim.state not in ("active", "releasing"):
            return f"claim {cid} is {claim.state}; only active or releasing claims are reclaimed"
        if claim.pod_uid not in pods:
            pods[claim.pod_uid] = await ask(self.ctx.nc, self.ctx.node, claim.pod_uid,
                                            fresh=True, timeout=self.ctx.tuning.watcher_timeout)
        evidence = pods[claim.pod_uid]
        if not evidence.dead:
            return (f"Pod {claim.pod_uid} of claim {cid} is not confirmed gone or finished "
                    f"({evidence.reason}); its partition stays")
        return ""

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
