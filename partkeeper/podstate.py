"""Pod-state predicates every service shares: what "dead", "being admitted" and "reclaimable now"
mean, in one place, so the allocator's room plan, the reclaimer's `reclaim.now` and the GC can
never disagree about them. Pure functions of the watcher's answers and the claims.
"""

from __future__ import annotations

from schemas import Claim, PodRecord

DEAD_STATES = frozenset({"finished", "gone"})

# How long a `creating` claim that was never activated may still be in the hands of an Allocate
# (docs/protocol.md). Before that, only the allocator that wrote it may undo it.
CREATE_TIMEOUT = 60.0


def is_dead(state: str | None) -> bool:
    """Dead = finished or gone, as only the watcher declares it. Unknown is not dead."""
    return state in DEAD_STATES


def being_admitted(pod: PodRecord | None) -> bool:
    """kubelet may still call (or re-call) Allocate for this Pod: the watcher knows it live,
    Pending and not being deleted. A Running Pod's containers have started; kubelet never
    allocates for them again, so a token of theirs it hands out again was freed."""
    return pod is not None and pod.state == "live" and pod.phase == "Pending" and not pod.deleting


def reclaimable_now(
    claim: Claim, *, pod_dead: bool, now: float, create_timeout: float = CREATE_TIMEOUT
) -> bool:
    """May this claim's partition be destroyed at once to make room?

    - `releasing`: yes, the intent to destroy is already durable;
    - `active` of a Pod confirmed finished or gone: yes;
    - `creating` of a dead Pod: only once `create_timeout` has passed since it was written, when
      no Allocate can still be creating it (before that, the Allocate that wrote it undoes it);
    - anything else: no.
    """
    if claim.state == "releasing":
        return True
    if not pod_dead:
        return False
    if claim.state == "active":
        return True
    return claim.state == "creating" and now - claim.created_at >= create_timeout
