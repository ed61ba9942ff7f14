"""The PK_PODS consumer: a Pod's death resolves every claim of that Pod, then the event is acked.

Ack policy (docs/reclaimer.md): the handler starts (or joins) one job per claim of the Pod and
waits while any of them is making progress, at most `event_patience`. When all are resolved the
event is acked. When some are stalled (a card refusing, the allocator mid-create) the event is
nak'ed with a delay and the redelivery re-checks. The claims are already durably `releasing` by
then, so waiting costs nothing but the reminder, and the consumer is never parked behind one card.
"""

from __future__ import annotations

import logging

from partkeeper.bus import Permanent, Retry
from partkeeper.bus.consumer import Delivery
from partkeeper.claims import StoreReadError
from partkeeper.drivers.base import DriverError
from partkeeper.telemetry.logs import decision
from schemas import Claim, PodEvent, PodFinished, PodGone, PodSeen
from schemas.pods import InvalidPodUID, validate_pod_uid
from services.reclaimer.context import Context
from services.reclaimer.jobs import Jobs
from services.reclaimer.pods import Evidence
from services.reclaimer.tuning import redelivery_delay

log = logging.getLogger(__name__)


async def claims_of(ctx: Context, uid: str) -> list[Claim]:
    """Every claim of Pod `uid` on this node. Raises StoreReadError or DriverError."""
    return [c for c in await ctx.claims() if c.pod_uid == uid]


def evidence_of(event: PodGone | PodFinished) -> Evidence:
    if isinstance(event, PodGone):
        return Evidence("gone", f"PodGone ({event.evidence})", event.observed_at)
    return Evidence("finished", f"PodFinished ({event.phase})", event.observed_at)


class PodEventHandler:
    def __init__(self, ctx: Context, jobs: Jobs) -> None:
        self.ctx = ctx
        self.jobs = jobs

    async def __call__(self, event: PodEvent, delivery: Delivery) -> None:
        if isinstance(event, PodSeen):
            return  # a live Pod changes nothing here
        try:
            validate_pod_uid(event.uid)
        except InvalidPodUID as exc:
            raise Permanent(f"{type(event).__name__} on {delivery.subject}: {exc}") from exc
        if event.node != self.ctx.node:
            raise Permanent(
                f"{type(event).__name__} for Pod {event.uid} names node {event.node!r}, "
                f"but arrived on node {self.ctx.node!r}'s subject {delivery.subject}"
            )
        try:
            claims = await claims_of(self.ctx, event.uid)
        except (StoreReadError, DriverError) as exc:
            raise Retry(f"Pod {event.uid}: claims unreadable ({exc}); will redeliver") from exc
        evidence = evidence_of(event)
        if not claims:
            decision(log, "no claims left; event done", pod_uid=event.uid, why=evidence.reason)
            return
        started = [self.jobs.ensure(c.card, c.id, evidence) for c in claims]
        patience = self.ctx.tuning.event_patience
        if await self.jobs.wait_idle(started, patience, tick=delivery.progress):
            decision(log, "every claim resolved; event done", pod_uid=event.uid,
                     claims=[c.id for c in claims], why=evidence.reason)
            return
        waiting = "; ".join(f"card {j.card} claim {j.claim_id}: {j.last}"
                            for j in started if not j.resolved)
        delay = redelivery_delay(delivery.attempt, self.ctx.tuning)
        raise Retry(f"Pod {event.uid}: not resolved yet ({waiting}); re-checking in {delay:.1f}s",
                    delay=delay)
