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

from partkeeper.podstate import is_dead
from services.allocator.core.catalog import Offer
from services.allocator.core.placement import Snapshot
from services.allocator.core.reclaimer import reclaim
from services.allocator.core.state import Context
from services.allocator.deviceplugin import decide, podmatch

log = logging.getLogger(__name__)

FRESH_ROUNDS = frozenset({1, 2, 4, 8, 16, 32})  # attempts at which live holders are re-asked


async def make(
    ctx: Context, offer: Offer, count: int, snap: Snapshot, attempt: int, until: float
) -> bool:
    """Try once to free room; True when something was destroyed (re-plan at once)."""
    plan = decide.reclaim_plan(offer, snap, count)
    if plan is None and attempt in FRESH_ROUNDS:
        confirmed = await confirm_dead(ctx, decide.suspects(offer, snap), until)
        if confirmed:
            plan = decide.reclaim_plan(offer, snap.with_dead(confirmed), count)
    if not plan:
        return False
    return await reclaim(ctx, [c.id for c in plan], f"room for {offer.resource}")


async def confirm_dead(ctx: Context, uids: list[str], until: float) -> set[str]:
    """The Pods among `uids` the watcher now confirms finished or gone (no answer: not dead)."""

    async def ask(uid: str) -> str | None:
        try:
            reply = await podmatch.pod_state(ctx, uid, until)
        except podmatch.LookupFailed as exc:
            log.info("%s; its partitions stay", exc)
            return None
        return uid if is_dead(reply.state) else None

    answers = await asyncio.gather(*(ask(uid) for uid in uids))
    return {uid for uid in answers if uid is not None}
