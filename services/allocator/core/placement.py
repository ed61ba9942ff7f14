"""Where a new partition (or slice) goes: a pure function of legal placements, claims, instances.

Occupied = claims in any state union physical instances, foreign ones included: a slot is never
offered while anything covers it (invariant 5). Among the cards where the profile still fits, the
most occupied one wins (packing keeps whole cards free for large profiles); ties go to the lowest
card index, and on the chosen card the lowest free legal start is taken. A failed card (a fatal
XID, or lost: partkeeper/drivers/cardhealth.py) takes nothing new, whatever room it has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from partkeeper.drivers import Instance
from partkeeper.drivers.profiles import overlaps
from schemas import Claim
from schemas.documents import ClaimKind
from services.allocator.core.catalog import Range


@dataclass(frozen=True, slots=True)
class Spot:
    card: int
    start: int
    size: int

    @property
    def range(self) -> Range:
        return (self.start, self.size)


def occupied(
    claims: Iterable[Claim], instances: Iterable[Instance], kind: ClaimKind
) -> dict[int, list[Range]]:
    """Per card, every range a claim of `kind` (any state) or a physical instance covers."""
    taken: dict[int, list[Range]] = {}
    for claim in claims:
        if claim.kind == kind:
            taken.setdefault(claim.card, []).append((claim.start, claim.size))
    if kind == "partition":
        for inst in instances:
            taken.setdefault(inst.card, []).append(inst.placement)
    return taken


def covered(ranges: Iterable[Range]) -> int:
    """How many distinct slices the ranges cover."""
    return len({s for start, size in ranges for s in range(start, start + size)})


def free_ranges(legal: Sequence[Range], taken: Sequence[Range]) -> list[Range]:
    """Legal placements that overlap nothing taken, lowest start first."""
    return sorted(r for r in legal if not any(overlaps(r, t) for t in taken))


def healthy(legal: Mapping[int, Sequence[Range]], failed: Set[int]) -> dict[int, Sequence[Range]]:
    """The legal placements of the cards that have not failed."""
    return {card: ranges for card, ranges in legal.items() if card not in failed}


def place_ranges(
    legal: Mapping[int, Sequence[Range]], taken: Mapping[int, Sequence[Range]], count: int = 1,
    *, failed: Set[int] = frozenset(),
) -> list[Spot] | None:
    """`count` non-overlapping spots, each by the rule above given the ones chosen before it,
    none on a `failed` card."""
    if count < 1:
        return []
    legal = healthy(legal, failed)
    load = {card: list(taken.get(card, ())) for card in legal}
    chosen: list[Spot] = []
    for _ in range(count):
        best: tuple[tuple[int, int], Spot] | None = None
        for card in sorted(legal):
            free = free_ranges(legal[card], load[card])
            if not free:
                continue
            key = (-covered(load[card]), card)
            if best is None or key < best[0]:
                best = (key, Spot(card, *free[0]))
        if best is None:
            return None
        spot = best[1]
        chosen.append(spot)
        load[spot.card].append(spot.range)
    return chosen


def place(
    legal: Mapping[int, Sequence[Range]],
    claims: Iterable[Claim],
    instances: Iterable[Instance],
    *,
    kind: ClaimKind = "partition",
    count: int = 1,
    failed: Set[int] = frozenset(),
) -> list[Spot] | None:
    """Spots for `count` new claims of `kind`, or None when they do not all fit now; never on a
    `failed` card."""
    return place_ranges(legal, occupied(claims, instances, kind), count, failed=failed)
