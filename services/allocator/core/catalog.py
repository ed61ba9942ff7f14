"""What the node offers kubelet: one resource per partition profile, one for logical slices.

Pure: a function of the cards the driver reports and the configuration. Each `Offer` carries its
stable token set and, per card, the legal placements of its profile, which is all placement and
capacity need to know about the hardware's shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from partkeeper.drivers import Card
from partkeeper.drivers.profiles import MODELS, ONE_PARTITION_PER_CONTAINER, max_instances
from schemas.documents import SLICE_PROFILE, ClaimKind

Range = tuple[int, int]  # (start, size) in slices of a card



@dataclass(frozen=True, slots=True)
class Offer:
    """One device-plugin resource: its tokens and where its instances may be placed."""

    resource: str
    kind: ClaimKind
    profile: str
    tokens: tuple[str, ...]
    legal: Mapping[int, tuple[Range, ...]]  # card index -> legal (start, size) of the profile
    # The vendors among the offer's cards whose runtimes make exactly one partition visible to
    # a container (T-Head, Hygon): a request for more is refused before anything is claimed.
    one_per_container: tuple[str, ...] = ()

    @property
    def cards(self) -> tuple[int, ...]:
        return tuple(sorted(self.legal))


def partition_resource(prefix: str, profile: str) -> str:
    return f"{prefix}{profile}"


def offers(
    cards: Sequence[Card], *, prefix: str, sliced_resource: str, slices_per_card: int
) -> dict[str, Offer]:
    """Every resource the node offers, by name, in a stable order.

    Token count per profile: the sum over the partition-mode cards offering it of the most
    instances of it an empty card holds; for slices, `slices_per_card` per sliced card. A
    partition-mode card of a model the tables do not know (or that the driver refused, see
    docs/drivers.md) offers nothing; its instances still count as occupied.
    """
    legal: dict[str, dict[int, tuple[Range, ...]]] = {}
    counts: dict[str, int] = {}
    single: dict[str, set[str]] = {}
    for card in sorted(cards, key=lambda c: c.index):
        if card.mode != "partition" or card.model not in MODELS:
            continue
        model = MODELS[card.model]
        for name, profile in model.profiles.items():
            legal.setdefault(name, {})[card.index] = profile.placements()
            counts[name] = counts.get(name, 0) + max_instances(profile)
            if model.vendor in ONE_PARTITION_PER_CONTAINER:
                single.setdefault(name, set()).add(model.vendor)
    found: dict[str, Offer] = {}
    for name in sorted(legal, key=_profile_order):
        resource = partition_resource(prefix, name)
        tokens = tuple(f"{name}-{i}" for i in range(counts[name]))
        found[resource] = Offer(resource, "partition", name, tokens, legal[name],
                                tuple(sorted(single.get(name, ()))))
    sliced = [c.index for c in cards if c.mode == "sliced"]
    if sliced:
        per_card = tuple((i, 1) for i in range(slices_per_card))
        tokens = tuple(f"slice-{i}" for i in range(slices_per_card * len(sliced)))
        found[sliced_resource] = Offer(
            sliced_resource, "slice", SLICE_PROFILE, tokens, dict.fromkeys(sorted(sliced), per_card)
        )
    return found


def _profile_order(name: str) -> tuple[int, int, str]:
    """1g before 2g before 7g, smaller memory first: the order people read profile tables in."""
    compute, _, rest = name.partition("g.")
    digits = "".join(ch for ch in rest if ch.isdigit())
    return (int(compute) if compute.isdigit() else 99, int(digits or 0), name)
