"""The allocator service: wiring, start-up order and shutdown.

Start-up order matters to kubelet: the plugins register only after the `pk-allocator` micro
service answers, the Pod view and the claims are loaded, and the first capacity computation has
set every token's health, so kubelet never sees a token Healthy that is not.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from nats.aio.client import Client
from nats.js.kv import KeyValue

from partkeeper import runtime
from partkeeper.config import Config
from partkeeper.health import HEALTH
from partkeeper.lifecycle import Lifecycle
from services.allocator import build, startup
from services.allocator.allocate import Allocator
from services.allocator.context import Context
from services.allocator.dra import leftover
from services.allocator.dra import main as dra_main
from services.allocator.options import Options
from services.allocator.plugin import Board
from services.allocator.registration import PluginServer, Registrar
from services.allocator.removals import Removals

log = logging.getLogger(__name__)


@dataclass
class Parts:
    ctx: Context
    claims_kv: KeyValue
    allocator: Allocator
    boards: dict[str, Board]
    servers: list[PluginServer]
    registrar: Registrar


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
        await dra_main.serve(config, nc, options, ready)
        return
    parts = await _build(config, nc, options)
    await asyncio.to_thread(parts.ctx.find_limiter)  # may refuse the start: before anything serves
    async with Lifecycle("allocator") as life:
        await _start(parts, life)
        log.info("allocator ready on node %s: %s", config.node, ", ".join(parts.ctx.offers))
        if ready is not None:
            ready.set()
        with HEALTH.condition("kubelet registration", lambda: parts.registrar.registered):
            await life.run()


def room_waited(config: Config, options: Options) -> Options:
    """`PK_ROOM_WAIT_SECONDS`, when set, over the options' room wait."""
    if config.room_wait_seconds is None:
        return options
    return replace(options, room_wait_seconds=config.room_wait_seconds)


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
    life.on_stop("the audit announcements", parts.ctx.store.settle)
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
    # A node moved back from DRA: the DRA claims still in the store end as in DRA mode.
    life.spawn("DRA claims from DRA mode", leftover.run(parts.ctx))


def main() -> int:
    return runtime.run("allocator", serve)
