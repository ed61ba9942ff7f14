"""What every part of the reclaimer shares: configuration, NATS, the claims store, the driver.

The driver is synchronous and always called through `asyncio.to_thread`. Destroys on one card are
serialised by a per-card lock (hardware serialises them anyway), but nothing holds that lock while
sleeping between retries, so a card that refuses holds up nobody.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from partkeeper.drivers.base import CardLostError, DriverError, Instance
from partkeeper.nodeparts import NodeParts
from schemas import CardClaims, Claim
from services.reclaimer.audit import Audit
from services.reclaimer.tuning import Tuning

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Enumeration:
    instances: list[Instance] | None  # None: the enumeration failed, absence means nothing
    lost: bool = False  # it failed because the card stopped answering


@dataclass(slots=True)
class Context(NodeParts):
    audit: Audit
    tuning: Tuning
    _locks: dict[int, asyncio.Lock] = field(default_factory=dict)
    _cards: list[int] | None = None

    def card_lock(self, card: int) -> asyncio.Lock:
        return self._locks.setdefault(card, asyncio.Lock())

    async def cards(self) -> list[int]:
        """The node's card indices (read once: cards do not come and go while we run).

        Raises DriverError while they cannot be read.
        """
        if self._cards is None:
            self._cards = [c.index for c in await asyncio.to_thread(self.driver.cards)]
        return self._cards

    async def documents(self, cards: list[int]) -> dict[int, CardClaims]:
        """The claims document of each card, each read by its key. Raises StoreReadError.

        By key rather than through a listing of the bucket: a listing is a watch whose "that was
        all" marker is the client's inference, and a claim missed here would be taken as absent.
        Claims exist only for cards the driver reports, so nothing is lost by asking for those.
        """
        return {card: (await self.store.read(card))[0] for card in cards}

    async def claims(self) -> list[Claim]:
        """Every claim of the node. Raises StoreReadError or DriverError, never a partial list."""
        docs = await self.documents(await self.cards())
        return [c for doc in docs.values() for c in doc.claims.values()]

    async def instances(self, card: int) -> list[Instance] | None:
        """The card's instances, or None when the enumeration failed (never 'none exist')."""
        return (await self.enumerate(card)).instances

    async def enumerate(self, card: int) -> Enumeration:
        """The card's instances, None when the enumeration failed, and whether it failed
        because the card is lost (it stopped answering: docs/reclaimer.md, "A lost card")."""
        try:
            return Enumeration(await asyncio.to_thread(self.driver.instances, card))
        except CardLostError as exc:
            log.warning("card %d is lost: %s", card, exc)
            return Enumeration(None, lost=True)
        except DriverError as exc:
            log.warning("enumerating card %d failed: %s", card, exc)
            return Enumeration(None)

    async def destroy(self, instance: Instance) -> None:
        """Destroy exactly `instance`; raises the driver's DriverError subclasses."""
        async with self.card_lock(instance.card):
            await asyncio.to_thread(self.driver.destroy, instance)
