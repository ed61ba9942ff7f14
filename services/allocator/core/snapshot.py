"""One consistent-enough read of everything a decision needs: claims, hardware, Pod states.

A read is fresh (the claims from the store with their revisions, the instances from the driver)
unless its caller plans a write on it and takes the views (views.py): then what is still current
there is not read again, and the snapshot says it is not `fresh`. The Pod states come from the
pk-pods mirror. A failed read of any card fails the whole snapshot (`SnapshotError`): nothing is
ever concluded from a partial enumeration (invariant 9).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from partkeeper.claims import StoreReadError
from partkeeper.claims.inventory import Inventory, classify
from partkeeper.drivers import Card, DriverError, IdentityRule, Instance
from partkeeper.drivers.base import CardLostError
from partkeeper.drivers.cardhealth import CardHealth
from schemas import CardClaims, Claim
from services.allocator.core.context import Context

log = logging.getLogger(__name__)

class SnapshotError(Exception):
    """The claims or the hardware could not be read completely."""


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


async def read_instances(ctx: Context) -> dict[int, tuple[Instance, ...]]:
    """Every partition-mode card's instances, in one thread hop, kept in the views. Raises
    SnapshotError."""
    partition_cards = [c.index for c in ctx.cards if c.mode == "partition"]

    def enumerate_all() -> dict[int, tuple[Instance, ...]]:
        found: dict[int, tuple[Instance, ...]] = {}
        for card in partition_cards:
            # A lost card answers nothing until it is reset: it is marked failed (nothing is
            # placed on it, none of its room counted) and listed empty, and the other cards
            # still serve. Its claims stay as they are; nothing concludes from its absence.
            try:
                found[card] = tuple(ctx.driver.instances(card))
            except CardLostError as exc:
                if card not in ctx.lost:
                    log.error("card %d is lost (%s): no partition is placed on it", card, exc)
                ctx.lost.add(card)
                found[card] = ()
            else:
                ctx.lost.discard(card)
        return found

    stamp = ctx.views.stamp()
    try:
        found = await ctx.hardware(enumerate_all)
    except DriverError as exc:
        ctx.views.enumerated(stamp, None)
        raise SnapshotError(f"enumerating the cards failed: {exc}") from exc
    ctx.views.enumerated(stamp, found)
    return found


@dataclass(frozen=True, slots=True)
class ClaimsRead:
    docs: dict[int, CardClaims]
    revisions: dict[int, int]
    fresh: bool = True  # False: some documents came from the views

    @property
    def claims(self) -> list[Claim]:
        return [c for card in sorted(self.docs) for c in self.docs[card].claims.values()]


async def read_claims(ctx: Context, *, views: bool = False) -> ClaimsRead:
    """Every card's claims document and revision, read concurrently; with `views`, a document
    still current in the views is taken from there. Raises SnapshotError."""
    cards = [c.index for c in ctx.cards]
    taken = {card: known for card in cards
             if views and (known := current_claims(ctx, card)) is not None}
    wanted = [card for card in cards if card not in taken]
    try:
        read_docs = await asyncio.gather(*(ctx.store.read(card) for card in wanted))
    except StoreReadError as exc:
        raise SnapshotError(f"reading the claims failed: {exc}") from exc
    found = taken | dict(zip(wanted, read_docs, strict=True))
    return ClaimsRead({card: found[card][0] for card in cards},
                      {card: found[card][1] for card in cards}, fresh=not taken)


def current_claims(ctx: Context, card: int) -> tuple[CardClaims, int] | None:
    """The card's document as this process last read or wrote it, if no newer revision has been
    delivered by the claims watch since (views.py)."""
    known = ctx.store.last(card)
    return known if known is not None and ctx.views.current(card, known[1]) else None


async def read(ctx: Context, claims: ClaimsRead | None = None) -> Snapshot:
    """A fresh snapshot; `claims`, when given, is a read of the claims just made, taken instead
    of reading them again, for a plan checked by the compare-and-set of the claim write. With it
    the instances come from the views too, when still current there."""
    known = claims if claims is not None else await read_claims(ctx)
    instances = ctx.views.instances() if claims is not None else None
    fresh = known.fresh and instances is None
    if instances is None:
        instances = await read_instances(ctx)
    uids = {c.pod_uid for doc in known.docs.values() for c in doc.claims.values()}
    dead = frozenset(uid for uid in uids if ctx.pods.dead(uid))
    return Snapshot({c.index: c for c in ctx.cards}, known.docs, known.revisions, instances,
                    ctx.driver.same_partition, dead, time.time(), fresh, ctx.health,
                    frozenset(ctx.lost))
