"""The allocator service: wiring, start-up order and shutdown.

Start-up order matters to kubelet: the plugins register only after the `pk-allocator` micro
service answers, the Pod view and the claims are loaded, and the first capacity computation has
set every token's health, so kubelet never sees a token Healthy that is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from nats.aio.client import Client
from nats.js.kv import KeyValue
from nats.micro.service import Service

from partkeeper import runtime
from partkeeper.bus import backoff
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers import Card, Driver, DriverError, open_driver
from partkeeper.errors import StartupError
from partkeeper.health import HEALTH
from schemas.names import BUCKET_CAPACITY, BUCKET_CLAIMS, BUCKET_PODS
from services.allocator import catalog, claims_service
from services.allocator.allocate import Allocator
from services.allocator.changes import Changes
from services.allocator.context import Context
from services.allocator.options import Options
from services.allocator.plugin import Board
from services.allocator.podresources import PodResources
from services.allocator.podview import PodView
from services.allocator.recompute import Recompute, watch_claims
from services.allocator.registration import PluginServer, Registrar
from services.allocator.removals import Removals

log = logging.getLogger(__name__)


@dataclass
class Parts:
    ctx: Context
    claims_kv: KeyValue
    allocator: Allocator
    servers: list[PluginServer]
    registrar: Registrar
    recompute: Recompute
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    service: Service | None = None

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        self.tasks.append(asyncio.create_task(work, name=name))


async def serve(
    config: Config,
    nc: Client,
    *,
    ready: asyncio.Event | None = None,
    options: Options | None = None,
) -> None:
    """Run the allocator until cancelled. `ready` is set once the plugin sockets serve (with
    correct health) and registration with kubelet has started."""
    options = room_waited(config, options or Options())
    if config.mode == "dra":
        from services.allocator.dra import main as dra_main  # it imports this module

        await dra_main.serve(config, nc, ready=ready, options=options)
        return
    parts = await _build(config, nc, options)
    try:
        await _start(parts)
        log.info("allocator ready on node %s: %s", config.node, ", ".join(parts.ctx.offers))
        if ready is not None:
            ready.set()
        with HEALTH.condition("kubelet registration", lambda: parts.registrar.registered):
            await asyncio.gather(*parts.tasks)
    finally:
        await _stop(parts)


def room_waited(config: Config, options: Options) -> Options:
    """`PK_ROOM_WAIT_SECONDS`, when set, over the options' room wait."""
    if config.room_wait_seconds is None:
        return options
    return replace(options, room_wait_seconds=config.room_wait_seconds)


async def _build(config: Config, nc: Client, options: Options) -> Parts:
    driver = options.driver
    if driver is None:
        driver = await asyncio.to_thread(open_driver, config)
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
    return Parts(
        ctx=ctx, claims_kv=claims_kv, allocator=allocator, servers=servers,
        registrar=Registrar(config.kubelet_dir, servers, options.kubelet_poll_seconds),
        recompute=Recompute(ctx, boards, await js.key_value(BUCKET_CAPACITY)),
    )


async def _start(parts: Parts) -> None:
    ctx = parts.ctx
    loaded, claims_seen, computed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    parts.spawn(ctx.pods.run(loaded), "allocator pod view")
    parts.spawn(watch_claims(ctx, parts.claims_kv, claims_seen), "allocator claims watch")
    await loaded.wait()
    await claims_seen.wait()
    parts.service = await claims_service.start(ctx.nc, ctx.node, ctx.store,
                                               [c.index for c in ctx.cards])
    parts.spawn(parts.recompute.run(computed), "allocator recompute")
    ctx.changes.touch()
    await computed.wait()
    parts.spawn(Removals(ctx, parts.recompute).run(), "allocator removals")
    for server in parts.servers:
        await _serve_first(server)
    parts.spawn(parts.registrar.run(), "allocator registration")
    parts.spawn(parts.recompute.poll_hardware(), "allocator hardware poll")


async def _stop(parts: Parts) -> None:
    for task in parts.tasks:
        task.cancel()
    await asyncio.gather(*parts.tasks, return_exceptions=True)
    await parts.allocator.close()  # before the servers: their handlers wait on these calls
    await parts.registrar.stop()
    if parts.service is not None:
        with contextlib.suppress(Exception):
            await parts.service.stop()
    await parts.ctx.podres.close()


async def _serve_first(server: PluginServer) -> None:
    """Serve a plugin socket at start; a directory we cannot bind in is a deployment error."""
    try:
        await server.start()
    except (OSError, RuntimeError) as exc:
        raise StartupError(
            f"cannot serve {server.offer.resource} on {server.path}: {exc}. PK_KUBELET_DIR must "
            "be the kubelet's device-plugins directory, mounted read-write into a container "
            "running as root"
        ) from exc


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
