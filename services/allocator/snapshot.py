"""One consistent-enough read of everything a decision needs: claims, hardware, Pod states.

Every read is fresh (the claims from the store with their revisions, the instances from the
driver); the Pod states come from the pk-pods mirror. A failed read of any card fails the whole
snapshot (`SnapshotError`): nothing is ever concluded from a partial enumeration (invariant 9).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from partkeeper.claims import StoreReadError
from partkeeper.claims.inventory import Inventory, classify
from partkeeper.drivers import Card, DriverError, IdentityRule, Instance
from schemas import CardClaims, Claim
from services.allocator.context import Context


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
    """Every partition-mode card's instances, in one thread hop. Raises SnapshotError."""
    partition_cards = [c.index for c in ctx.cards if c.mode == "partition"]

    def enumerate_all() -> dict[int, tuple[Instance, ...]]:
        return {card: tuple(ctx.driver.instances(card)) for card in partition_cards}

    try:
        return await ctx.hardware(enumerate_all)
    except DriverError as exc:
        raise SnapshotError(f"enumerating the cards failed: {exc}") from exc


async def read_claims(ctx: Context) -> tuple[dict[int, CardClaims], dict[int, int]]:
    """Every card's claims document and revision, read concurrently. Raises SnapshotError."""
    cards = [c.index for c in ctx.cards]
    try:
        read_docs = await asyncio.gather(*(ctx.store.read(card) for card in cards))
    except StoreReadError as exc:
        raise SnapshotError(f"reading the claims failed: {exc}") from exc
    docs = {card: doc for card, (doc, _) in zip(cards, read_docs, strict=True)}
    revisions = {card: rev for card, (_, rev) in zip(cards, read_docs, strict=True)}
    return docs, revisions


ClaimsRead = tuple[dict[int, CardClaims], dict[int, int]]


async def read(ctx: Context, claims: ClaimsRead | None = None) -> Snapshot:
    """A fresh snapshot; `claims`, when given, is a read of the claims just made, taken instead
    of reading them again (a plan on it is checked by the compare-and-set of the claim write)."""
    docs, revisions = claims if claims is not None else await read_claims(ctx)
    instances = await read_instances(ctx)
    uids = {c.pod_uid for doc in docs.values() for c in doc.claims.values()}
    dead = frozenset(uid for uid in uids if ctx.pods.dead(uid))
    return Snapshot({c.index: c for c in ctx.cards}, docs, revisions, instances,
                    ctx.driver.same_partition, dead, time.time())
