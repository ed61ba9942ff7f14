"""How many instances of each profile can be placed now: pure functions of one snapshot.

Within one profile every placement has the same size, so choosing free legal placements greedily
by start is a maximum packing (interval scheduling with equal lengths); the count is exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

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
    offer: Offer, claims: Iterable[Claim], instances: Iterable[Instance]
) -> dict[int, int]:
    """Card -> instances of the offer's profile placeable there now."""
    taken = occupied(claims, instances, offer.kind)
    return {card: placeable(legal, taken.get(card, ())) for card, legal in offer.legal.items()}


def by_card(
    offers: Mapping[str, Offer], claims: Sequence[Claim], instances: Sequence[Instance]
) -> dict[int, dict[str, int]]:
    """Card -> profile -> placeable now, for every offer (the capacity document's view)."""
    view: dict[int, dict[str, int]] = {}
    for offer in offers.values():
        for card, count in free_per_card(offer, claims, instances).items():
            view.setdefault(card, {})[offer.profile] = count
    return view
