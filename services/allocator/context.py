"""What the allocator's parts share, built once at start by `main.serve`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.js import JetStreamContext

from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers import Card, Driver
from services.allocator.catalog import Offer
from services.allocator.changes import Changes
from services.allocator.options import Options
from services.allocator.podresources import PodResources
from services.allocator.podview import PodView


@dataclass
class Context:
    config: Config
    nc: Client
    js: JetStreamContext
    store: ClaimsStore
    driver: Driver
    cards: tuple[Card, ...]
    offers: dict[str, Offer]
    pods: PodView
    changes: Changes
    podres: PodResources
    options: Options = field(default_factory=Options)
    # Serialises "plan, then write the creating claims" inside this process; across processes the
    # compare-and-set on each card's document does the same job.
    placing: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def node(self) -> str:
        return self.config.node

    def card(self, index: int) -> Card:
        return next(c for c in self.cards if c.index == index)
