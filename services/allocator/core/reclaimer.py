"""Asking the reclaimer to destroy claims' partitions now (`reclaim.now`), so an allocation that
needs their room goes on: the allocator never destroys them itself (invariant 2). Device-plugin
mode asks when an Allocate does not fit (`deviceplugin/room.py`), DRA mode when a ResourceClaim's
use has ended (`dra/ends.py`)."""

from __future__ import annotations

import logging

from partkeeper.bus import Unanswered
from partkeeper.bus.clients import ReclaimerClient
from partkeeper.telemetry.logs import decision
from services.allocator.core.state import Context

log = logging.getLogger(__name__)


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
