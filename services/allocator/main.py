"""The allocator service: wiring, start-up order and shutdown.

Start-up order matters to kubelet: the plugins register only after the `pk-allocator` micro
service answers, the Pod view and the claims are loaded, and the first capacity computation has
set every token's health, so kubelet never sees a token Healthy that is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client

from partkeeper import runtime
from partkeeper.bus import backoff
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers import Card, Driver, DriverError, open_driver
from schemas.names import BUCKET_CAPACITY, BUCKET_CLAIMS, BUCKET_PODS
from services.allocator import catalog, claims_service
from services.allocator.allocate import Allocator
from services.allocator.changes import Changes
from services.allocator.context import Context
from services.allocator.options import Options
from services.allocator.plugin import Board
from services.allocator.podresources import PodResources
from services.allocator.podview import PodView
from services.allocator.recompute import Recompute, poll_hardware, watch_claims
from services.allocator.registration import PluginServer, Registrar

log = logging.getLogger(__name__)


async def serve(
    config: Config,
    nc: Client,
    *,
    ready: asyncio.Event | None = None,
    options: Options | None = None,
) -> None:
    """Run the allocator until cancelled. `ready` is set once the plugin sockets serve (with
    correct health) and registration with kubelet has started."""
    options = options or Options()
    driver = options.driver or await asyncio.to_thread(open_driver, config)
    cards = await _cards(driver)
    js = nc.jetstream()
    claims_kv = await js.key_value(BUCKET_CLAIMS)
    changes = Changes()
    ctx = Context(
        config=config, nc=nc, js=js, store=ClaimsStore(claims_kv, config.node), driver=driver,
        cards=cards,
        offers=catalog.offers(cards, prefix=config.resource_prefix,
                              sliced_resource=config.sliced_resource,
                              slices_per_card=config.slices_per_card),
        pods=PodView(await js.key_value(BUCKET_PODS), config.node, changes.touch),
        changes=changes, podres=PodResources(config.pod_resources_socket), options=options,
    )
    allocator = Allocator(ctx)
    boards = {resource: Board(offer.tokens) for resource, offer in ctx.offers.items()}
    servers = [PluginServer(config.kubelet_dir, offer, boards[resource], allocator)
               for resource, offer in ctx.offers.items()]
    registrar = Registrar(config.kubelet_dir, servers, options.kubelet_poll_seconds)
    recompute = Recompute(ctx, boards, await js.key_value(BUCKET_CAPACITY))
    tasks: list[asyncio.Task[None]] = []
    service = None
    try:
        loaded, claims_seen, computed = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks.append(asyncio.create_task(ctx.pods.run(loaded), name="allocator pod view"))
        tasks.append(asyncio.create_task(watch_claims(ctx, claims_kv, claims_seen),
                                         name="allocator claims watch"))
        await loaded.wait()
        await claims_seen.wait()
        service = await claims_service.start(nc, config.node, ctx.store,
                                             [c.index for c in cards])
        tasks.append(asyncio.create_task(recompute.run(computed), name="allocator recompute"))
        changes.touch()
        await computed.wait()
        for server in servers:
            await server.start()
        tasks.append(asyncio.create_task(registrar.run(), name="allocator registration"))
        tasks.append(asyncio.create_task(poll_hardware(ctx), name="allocator hardware poll"))
        log.info("allocator ready on node %s: %s", config.node, ", ".join(ctx.offers))
        if ready is not None:
            ready.set()
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await registrar.stop()
        if service is not None:
            with contextlib.suppress(Exception):
                await service.stop()
        await allocator.close()
        await ctx.podres.close()


async def _cards(driver: Driver) -> tuple[Card, ...]:
    """The node's cards; retried while the driver cannot enumerate them (never taken as none)."""
    attempt = 0
    while True:
        try:
            return tuple(await asyncio.to_thread(driver.cards))
        except DriverError as exc:
            attempt += 1
            wait = backoff.delay(attempt, base=0.5, cap=10.0)
            log.warning("cannot enumerate the cards (%s); again in %.1fs", exc, wait)
            await asyncio.sleep(wait)


def main() -> int:
    return runtime.run("allocator", serve)
