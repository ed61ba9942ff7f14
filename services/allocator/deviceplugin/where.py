"""Where an Allocate's partitions go, and what to do when they do not fit: pure decisions.

The placement itself is `core.placement.place` (legal placements minus claims and instances).
Around it, for one Allocate:

- `after_miss`: what follows a plan that wrote nothing: plan again on a fresh read, make room,
  plan again at once, wait for a change, or refuse once the Allocate's deadline has come;
- `ROOM_WAIT`: the schedule of the waits for a change, bounded by the deadline;
- `reclaim_plan`: the claims reclaimable now (`partkeeper.podstate.reclaimable_now`, shared with
  the reclaimer's `reclaim.now`) whose destruction would make room, or None when even destroying
  all of them would not;
- `suspects`: the Pods of the other holders, to be asked about afresh;
- `describe`: the refusal sentence, naming what is full and what holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from partkeeper import backoff
from partkeeper.drivers.profiles import overlaps
from partkeeper.podstate import reclaimable_now
from schemas import Claim
from services.allocator.core.catalog import Offer
from services.allocator.core.placement import Spot, place
from services.allocator.core.snapshot import Snapshot

# The waits for a change while nothing fits: a change (a claim removed, an instance destroyed)
# ends one early; the ceiling doubles from 0.2 s to 4 s, never past the deadline.
ROOM_WAIT = backoff.Schedule(base=0.2, cap=4.0)


class Step(Enum):
    READ_FRESH = "plan again on a fresh read"
    MAKE_ROOM = "make room, then plan again"
    PLAN_AGAIN = "plan again at once"
    WAIT = "wait for a change, then plan again"
    REFUSE = "refuse: no room by the deadline"


def after_miss(
    *, placed: bool, fresh: bool, attempt: int, made_room_at: int, remaining: float,
    room_failed: bool = False,
) -> Step:
    """What follows a plan that wrote no claims.

    `placed`: the plan found spots (another writer took them before the claims were written);
    `fresh`: it was made on a fresh read, not the views; `attempt`: the number of this miss among
    those on fresh reads (1 for the first); `made_room_at`: the attempt after which room was last
    made (0: never); `remaining`: seconds to the Allocate's deadline; `room_failed`: room was just
    tried for this attempt and none was made.

    A plan on the views that finds no room is made again on a fresh read. Room is made at once
    after a miss, but not twice in a row: a reclaimer that says "destroyed" while the room stays
    taken must not be asked in a tight loop. Spots lost to another writer are planned again at
    once; no spots, waited for.
    """
    if not placed and not fresh:
        return Step.READ_FRESH
    if not placed and not room_failed and remaining > 0 and made_room_at != attempt - 1:
        return Step.MAKE_ROOM
    if remaining <= 0:
        return Step.REFUSE
    return Step.PLAN_AGAIN if placed else Step.WAIT


def _reclaimable(claim: Claim, snap: Snapshot) -> bool:
    """The one definition `reclaim.now` applies too (partkeeper.podstate)."""
    return reclaimable_now(claim, pod_dead=snap.is_dead(claim.pod_uid), now=snap.read_at)


def _looks_live(claim: Claim, snap: Snapshot) -> bool:
    return claim.state != "releasing" and not snap.is_dead(claim.pod_uid)


def _relevant(offer: Offer, snap: Snapshot) -> list[Claim]:
    return [c for c in snap.claims if c.kind == offer.kind and c.card in offer.legal]


def reclaim_plan(offer: Offer, snap: Snapshot, count: int) -> list[Claim] | None:
    """The dead holders to destroy so that `count` instances of the offer fit; None if no plan."""
    dead = {c.id: c for c in _relevant(offer, snap) if _reclaimable(c, snap)}
    theirs: dict[tuple[int, int], str] = {}  # (card, GI id) of an instance -> its dead claim
    for card in snap.docs:
        inv = snap.inventory(card)
        for claim_id, inst in (*inv.owned.items(), *inv.unrecorded.items()):
            if claim_id in dead:
                theirs[(card, inst.gi_id)] = claim_id
    claims = [c for c in snap.claims if c.id not in dead]
    instances = [i for i in snap.all_instances if (i.card, i.gi_id) not in theirs]
    spots = place(offer.legal, claims, instances, kind=offer.kind, count=count,
                  failed=snap.failed)
    if spots is None:
        return None
    hit: set[str] = set()
    for claim in dead.values():
        if _covers(spots, claim.card, (claim.start, claim.size)):
            hit.add(claim.id)
    for inst in snap.all_instances:
        owner = theirs.get((inst.card, inst.gi_id))
        if owner is not None and _covers(spots, inst.card, inst.placement):
            hit.add(owner)
    return [dead[i] for i in sorted(hit)]


def _covers(spots: Sequence[Spot], card: int, rng: tuple[int, int]) -> bool:
    return any(s.card == card and overlaps(s.range, rng) for s in spots)


def suspects(offer: Offer, snap: Snapshot) -> list[str]:
    """Pods holding room the offer could use that look live: worth a fresh question."""
    return sorted({c.pod_uid for c in _relevant(offer, snap) if _looks_live(c, snap)})


def describe(
    offer: Offer, snap: Snapshot, count: int, node: str, waited: float, target: object = None
) -> str:
    """One sentence: what is full, for whom, and what holds it."""
    holders: list[str] = []
    for card in offer.cards:
        info = snap.cards.get(card)
        model = f" ({info.model})" if info is not None else ""
        if card in snap.failed:
            fault = snap.health.card_fault(card)
            why = fault.meaning if fault is not None else "the card stopped answering"
            holders.append(f"card {card}{model} has failed ({why}) and takes no new partition")
            continue
        parts = [_claim_text(c, snap) for c in snap.claims
                 if c.card == card and c.kind == offer.kind]
        doc = snap.docs.get(card)
        if doc is not None and offer.kind == "partition":
            inv = snap.inventory(card)
            parts += [f"a foreign {i.profile} at slices {_span(i.start, i.size)} ({i.uuid})"
                      for i in inv.foreign]
        holders.append(f"card {card}{model} holds " + ("; ".join(parts) or "nothing we can see"))
    what = "slice" if offer.kind == "slice" else f"{offer.profile} partition"
    whom = f" for {target}" if target is not None else ""
    return (
        f"no room for {count} {what}(s) of {offer.resource}{whom} on node {node} after waiting "
        f"{waited:.0f}s: " + ". ".join(holders) + "." + _mix(offer, snap) + " Nothing was claimed."
    )


def _mix(offer: Offer, snap: Snapshot) -> str:
    """Profiles share a card's memory slices, and kubelet counts each profile's tokens apart: it
    admits Pods whose mix of profiles cannot fit on the card together (7 x 1g and 1 x 7g are all
    Healthy on an empty card). Say so when live partitions of other profiles are what is in the
    way; only partitionable-device DRA removes the over-admission."""
    if offer.kind != "partition":
        return ""
    others = sorted({c.profile for c in _relevant(offer, snap)
                     if c.profile != offer.profile and _looks_live(c, snap)})
    if not others:
        return ""
    return (f" The profile mix cannot fit on the card: {offer.profile} needs memory slices that "
            f"live {', '.join(others)} partitions hold, though kubelet saw Healthy tokens of "
            "each; this Pod can run once they end.")


def _claim_text(claim: Claim, snap: Snapshot) -> str:
    pod = "confirmed finished or gone" if snap.is_dead(claim.pod_uid) else "live"
    return (
        f"{claim.profile} at slices {_span(claim.start, claim.size)} for Pod {claim.namespace}/"
        f"{claim.name} ({claim.pod_uid}, {pod}; claim {claim.id} {claim.state})"
    )


def _span(start: int, size: int) -> str:
    return str(start) if size == 1 else f"{start}-{start + size - 1}"
