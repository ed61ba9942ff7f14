"""How many instances of each profile can be placed now: pure functions of one snapshot.

Within one profile every placement has the same size, so choosing free legal placements greedily
by start is a maximum packing (interval scheduling with equal lengths); the count is exact. A
failed card places nothing: its count is 0 (DESIGN.md, "Card health").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set

from partkeeper.drivers import Instance
from partkeeper.drivers.profiles import overlaps
from schemas import Claim
from services.allocator.core.catalog import Offer, Range
from services.allocator.core.placement import occupied


def placeable(legal: Sequence[Range], taken: Sequence[Range]) -> int:
    """Instances of one profile that fit at once beside `taken`, on one card."""
    chosen: list[Range] = []
    for candidate in sorted(legal):
        if not any(overlaps(candidate, t) for t in (*taken, *chosen)):
            chosen.append(candidate)
    return len(chosen)


def free_per_card(
    offer: Offer, claims: Iterable[Claim], instances: Iterable[Instance],
    failed: Set[int] = frozenset(),
) -> dict[int, int]:
    """Card -> instances of the offer's profile placeable there now (0 on a `failed` card)."""
    taken = occupied(claims, instances, offer.kind)
    return {card: 0 if card in failed else placeable(legal, taken.get(card, ()))
            for card, legal in offer.legal.items()}


def by_card(
    offers: Mapping[str, Offer], claims: Sequence[Claim], instances: Sequence[Instance],
    failed: Set[int] = frozenset(),
) -> dict[int, dict[str, int]]:
    """Card -> profile -> placeable now, for every offer (the capacity document's view)."""
    view: dict[int, dict[str, int]] = {}
    for offer in offers.values():
        for card, count in free_per_card(offer, claims, instances, failed).items():
            view.setdefault(card, {})[offer.profile] = count
    return view
