"""Where a new partition (or slice) goes: a pure function of legal placements, claims, instances.

Occupied = claims in any state union physical instances, foreign ones included: a slot is never
offered while anything covers it (invariant 5). A claim whose partition a host reboot removed
(`rebooted`) covers nothing: nothing exists there, and it takes room again only once re-made.
Among the cards where the profile still fits, the
most occupied one wins (packing keeps whole cards free for large profiles); ties go to the lowest
card index, and on the chosen card the lowest free legal start is taken. A failed card (a fatal
XID, or lost: partkeeper/drivers/cardhealth.py) takes nothing new, whatever room it has.

A plan is made for a `Target` (the container a claim is written for) on a `Snapshot` (the
claims, the cards' instances and the Pod states one read found; `state.read` makes one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace

from partkeeper.claims.inventory import Inventory, classify
from partkeeper.drivers import Card, IdentityRule, Instance
from partkeeper.drivers.cardhealth import CardHealth
from partkeeper.drivers.profiles import overlaps
from schemas import CardClaims, Claim
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


@dataclass(frozen=True, slots=True)
class Target:
    """The container a claim is written for."""

    uid: str
    namespace: str
    name: str
    container: str

    def __str__(self) -> str:
        return f"Pod {self.namespace}/{self.name} ({self.uid}) container {self.container}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    cards: Mapping[int, Card]
    docs: Mapping[int, CardClaims]
    revisions: Mapping[int, int]
    instances: Mapping[int, tuple[Instance, ...]]
    same: IdentityRule  # the driver's identity rule (`same_partition`), for `inventory`
    dead: frozenset[str] = field(default_factory=frozenset)  # Pods confirmed finished or gone
    read_at: float = 0.0  # wall-clock time of the read (claims' ages are judged against it)
    fresh: bool = True  # False: some of it came from the views, fit to plan a write on only
    health: CardHealth = field(default_factory=CardHealth)  # the card watch's fold
    lost: frozenset[int] = frozenset()  # cards this read found lost (their instances unread)

    @property
    def failed(self) -> frozenset[int]:
        """Cards that take nothing new: failed by a fatal event, or lost."""
        return self.health.failed_cards() | self.lost

    def claim_failed(self, claim: Claim) -> bool:
        """Whether the claim's card failed, or its own partition did."""
        if claim.card in self.failed:
            return True
        inst = claim.instance
        return inst is not None and self.health.instance_fault(
            claim.card, inst.gi_id, inst.ci_id) is not None

    @property
    def claims(self) -> list[Claim]:
        return [c for card in sorted(self.docs) for c in self.docs[card].claims.values()]

    @property
    def all_instances(self) -> list[Instance]:
        return [i for card in sorted(self.instances) for i in self.instances[card]]

    def inventory(self, card: int) -> Inventory:
        """The card's instances matched to its claims by the driver's identity rule."""
        return classify(self.docs[card], list(self.instances.get(card, ())), self.same)

    def is_dead(self, uid: str) -> bool:
        return uid in self.dead

    def with_dead(self, uids: Iterable[str]) -> Snapshot:
        return replace(self, dead=self.dead | frozenset(uids))


def occupied(
    claims: Iterable[Claim], instances: Iterable[Instance], kind: ClaimKind
) -> dict[int, list[Range]]:
    """Per card, every range a claim of `kind` (any state) or a physical instance covers; a
    claim whose partition a reboot removed covers nothing until it is re-made (`remake.py`)."""
    taken: dict[int, list[Range]] = {}
    for claim in claims:
        if claim.kind == kind and not claim.rebooted:
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
