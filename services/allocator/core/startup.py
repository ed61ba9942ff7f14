"""What both modes of the allocator run first, in this order, on the runtime kit (`Lifecycle`):

    the host's boot recorded on the claims (partkeeper/claims/boot.py) -> Pod view and claims
    watch (both loaded) -> pk-allocator micro service (`claims.query`) ->
    capacity recompute (its first pass done) -> hardware poll and card health watch

Each mode then starts what kubelet talks to: the device-plugin sockets and their registration
(`deviceplugin/main.py`), or the ResourceSlices and the DRA plugin (`dra/main.py`). One function,
imported by both, so neither mode imports the other and the order cannot drift apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from nats.js.kv import KeyValue

from partkeeper.claims import boot
from partkeeper.errors import StartupError
from partkeeper.lifecycle import Lifecycle
from schemas.names import BUCKET_CAPACITY
from services.allocator.core import claims_service
from services.allocator.core.health import Health
from services.allocator.core.recompute import Board, Recompute, Users, watch_claims
from services.allocator.core.state import Context


async def start(
    ctx: Context, claims_kv: KeyValue, life: Lifecycle, boards: Mapping[str, Board],
    users: Users | None = None,
) -> Recompute:
    """Start the shared parts in order (module docstring); the recompute, once computed."""
    # Before anything reads the claims: a reboot since they were written marks them (the
    # partitions it removed hold no room), a plain restart changes nothing.
    await boot.settle(ctx.store, [c.index for c in ctx.cards], ctx.config.proc_root)
    loaded, claims_seen, computed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    life.spawn("pod view", ctx.pods.run(loaded))
    life.spawn("claims watch", watch_claims(ctx, claims_kv, claims_seen))
    await life.until(loaded)
    await life.until(claims_seen)
    service = await claims_service.start(ctx.nc, ctx.node, ctx.store, [c.index for c in ctx.cards])
    life.on_stop("the claims.query service", service.stop)
    recompute = Recompute(ctx, boards, await ctx.js.key_value(BUCKET_CAPACITY), users)
    life.spawn("recompute", recompute.run(computed))
    ctx.changes.touch()
    await life.until(computed)
    life.spawn("hardware poll", recompute.poll_hardware())
    health = Health(ctx)
    life.spawn("card health", health.run())
    await life.until(health.watch.opened)
    return recompute


def unservable(what: str, exc: Exception, mounts: str) -> StartupError:
    """A socket directory we cannot bind in: a deployment error, said with what to mount."""
    return StartupError(
        f"cannot serve {what}: {exc}. {mounts}, mounted read-write into a container running as "
        "root")
