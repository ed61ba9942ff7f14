"""Making room when an Allocate does not fit, before anything is refused.

1. Holders whose Pods are confirmed finished or gone (whatever their claim's state: the reclaimer
   may not have seen the event yet) are destroyed through `reclaim.now`, and the Allocate goes on
   when it answers. The allocator never destroys them itself (invariant 2).
2. When the holders look live, kubelet may still have freed their tokens because their containers
   stopped before the watcher noticed: their Pods are asked about with `pods.get{fresh: true}`
   and those now confirmed finished or gone are reclaimed the same way.
3. Otherwise the caller waits for the next change and tries again, until its deadline.
"""

from __future__ import annotations

import asyncio
import logging

from partkeeper.bus import Unanswered
from partkeeper.bus.clients import ReclaimerClient
from partkeeper.podstate import is_dead
from partkeeper.telemetry.logs import decision
from services.allocator import blockers, podmatch
from services.allocator.catalog import Offer
from services.allocator.context import Context
from services.allocator.snapshot import Snapshot

log = logging.getLogger(__name__)

FRESH_ROUNDS = frozenset({1, 2, 4, 8, 16, 32})  # attempts at which live holders are re-asked


async def make(ctx: Context, offer: Offer, count: int, snap: Snapshot, attempt: int) -> bool:
    """Try once to free room; True when something was destroyed (re-plan at once)."""
    plan = blockers.reclaim_plan(offer, snap, count)
    if plan is None and attempt in FRESH_ROUNDS:
        confirmed = await confirm_dead(ctx, blockers.suspects(offer, snap))
        if confirmed:
            plan = blockers.reclaim_plan(offer, snap.with_dead(confirmed), count)
    if not plan:
        return False
    return await reclaim(ctx, [c.id for c in plan], f"room for {offer.resource}")


async def confirm_dead(ctx: Context, uids: list[str]) -> set[str]:
    """The Pods among `uids` the watcher now confirms finished or gone (no answer: not dead)."""

    async def ask(uid: str) -> str | None:
        try:
            reply = await podmatch.pod_state(ctx, uid, fresh=True)
        except podmatch.LookupFailed as exc:
            log.info("%s; its partitions stay", exc)
            return None
        return uid if is_dead(reply.state) else None

    answers = await asyncio.gather(*(ask(uid) for uid in uids))
    return {uid for uid in answers if uid is not None}


async def reclaim(ctx: Context, claim_ids: list[str], reason: str) -> bool:
    """Ask the reclaimer to destroy these claims' partitions now; True if any was destroyed."""
    try:
        reclaimer = ReclaimerClient(ctx.nc, ctx.node, ctx.options.reclaim_timeout)
        reply = await reclaimer.now(claim_ids, reason)
    except Unanswered as exc:
        log.warning("reclaim.now for claims %s got no usable answer (%s); waiting instead",
                    ",".join(claim_ids), exc)
        return False
    for outcome in reply.outcomes:
        decision(log, f"reclaim.now: {'destroyed' if outcome.done else 'refused'}: "
                 f"{outcome.reason}", claim_id=outcome.claim_id)
    return any(o.done for o in reply.outcomes)
