"""What both modes of the allocator build first: the driver, the cards, the claims store, the Pod
view and the `Context` that carries them (device-plugin mode: `main.py`; DRA mode:
`dra/main.py`). One function, imported by both, so neither imports the other."""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client
from nats.js.kv import KeyValue

from partkeeper import backoff, runtime
from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers import Card, Driver, DriverError
from schemas.names import BUCKET_CLAIMS
from services.allocator.core import catalog
from services.allocator.core.options import Options
from services.allocator.core.podview import PodView
from services.allocator.core.state import Changes, Context

log = logging.getLogger(__name__)


async def context(config: Config, nc: Client, options: Options) -> tuple[Context, KeyValue]:
    """The allocator's shared parts, and the claims bucket's KV for the claims watch."""
    driver = options.driver
    if driver is None:
        driver = await runtime.open_driver(config)
    cards = await enumerate_cards(driver)
    js = nc.jetstream()
    claims = await Bucket.open(js, BUCKET_CLAIMS)
    changes = Changes()
    store = ClaimsStore(claims, config.node, announce=True)
    ctx = Context(
        config=config, nc=nc, js=js, store=store,
        driver=driver,
        cards=cards,
        offers=catalog.offers(cards, prefix=config.resource_prefix,
                              sliced_resource=config.sliced_resource,
                              slices_per_card=config.slices_per_card),
        pods=PodView(nc, config.node, changes.touch),
        changes=changes, options=options,
    )
    store.announce_after = ctx.quiet  # the audit follows the Allocates in flight
    return ctx, claims.kv


async def enumerate_cards(driver: Driver) -> tuple[Card, ...]:
    """The node's cards; retried while the driver cannot enumerate them (never taken as none)."""
    cards = await backoff.retry(
        "enumerating the cards", lambda: asyncio.to_thread(driver.cards),
        transient=lambda exc: isinstance(exc, DriverError), schedule=backoff.Schedule(0.5, 10.0),
    )
    return tuple(cards)
