"""The allocator in device-plugin mode: wiring, start-up order and shutdown.

Start-up order matters to kubelet: the plugins register only after the `pk-allocator` micro
service answers, the Pod view and the claims are loaded, and the first capacity computation has
set every token's health, so kubelet never sees a token Healthy that is not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.js.kv import KeyValue

from partkeeper.config import Config
from partkeeper.health import HEALTH
from partkeeper.lifecycle import Lifecycle
from services.allocator.core import build, startup
from services.allocator.core.options import Options
from services.allocator.core.state import Context
from services.allocator.deviceplugin.allocate import Allocator
from services.allocator.deviceplugin.plugin import Board
from services.allocator.deviceplugin.registration import PluginServer, Registrar
from services.allocator.deviceplugin.removals import Removals

log = logging.getLogger(__name__)


@dataclass
class Parts:
    ctx: Context
    claims_kv: KeyValue
    allocator: Allocator
    boards: dict[str, Board]
    servers: list[PluginServer]
    registrar: Registrar


# A task run beside the device plugin over its context, named for the logs (`main.serve` hands
# in the end of DRA claims left by DRA mode, which this mode must not import).
Beside = tuple[str, Callable[[Context], Coroutine[Any, Any, None]]]


async def serve(
    config: Config, nc: Client, options: Options, ready: asyncio.Event | None,
    also: Beside | None = None,
) -> None:
    """Run the device-plugin allocator until cancelled (`main.serve` in device-plugin mode);
    `ready` is set once the plugin sockets serve (with correct health) and registration with
    kubelet has started; `also` runs beside it once it has started."""
    parts = await _build(config, nc, options)
    await asyncio.to_thread(parts.ctx.find_limiter)  # may refuse the start: before anything serves
    async with Lifecycle("allocator") as life:
        await _start(parts, life)
        if also is not None:
            name, run = also
            life.spawn(name, run(parts.ctx))
        log.info("allocator ready on node %s: %s", config.node, ", ".join(parts.ctx.offers))
        if ready is not None:
            ready.set()
        with HEALTH.condition("kubelet registration", lambda: parts.registrar.registered):
            await life.run()


async def _build(config: Config, nc: Client, options: Options) -> Parts:
    ctx, claims_kv = await build.context(config, nc, options)
    allocator = Allocator(ctx)
    boards = {resource: Board(offer.tokens) for resource, offer in ctx.offers.items()}
    servers = [PluginServer(config.kubelet_dir, offer, boards[resource], allocator)
               for resource, offer in ctx.offers.items()]
    return Parts(
        ctx=ctx, claims_kv=claims_kv, allocator=allocator, boards=boards, servers=servers,
        registrar=Registrar(config.kubelet_dir, servers, options.kubelet_poll_seconds),
    )


async def _start(parts: Parts, life: Lifecycle) -> None:
    recompute = await startup.start(parts.ctx, parts.claims_kv, life, parts.boards)
    life.spawn("removals", Removals(parts.ctx, recompute).run())
    # Stopped after the tasks, in this order: the Allocate calls in flight first (the servers'
    # handlers wait on them), then registration and the plugin servers, then the claims
    # announcements those calls left in flight.
    life.on_stop("the audit announcements", parts.ctx.store.drain)
    life.on_stop("registration and the plugin servers", parts.registrar.stop)
    life.on_stop("the Allocate calls", parts.allocator.close)
    for server in parts.servers:
        try:
            await server.start()
        except (OSError, RuntimeError) as exc:
            raise startup.unservable(
                f"{server.offer.resource} on {server.path}", exc,
                "PK_KUBELET_DIR must be the kubelet's device-plugins directory") from exc
    life.spawn("registration", parts.registrar.run())

