"""The allocator in DRA mode: what it runs, in start-up order, on the runtime kit (`Lifecycle`).

    what both modes start (`startup.start`: Pod view, claims watch, pk-allocator micro service,
    capacity recompute for status and metrics, hardware poll) ->
    ResourceSlice publisher and the watch of its slices (first publication awaited) ->
    device-health feed (first list computed) -> kubelet plugin sockets (DRAPlugin and
    DRAResourceHealth) -> ResourceClaim watch and claim lifetimes (release once a
    ResourceClaim's use ends; the watch wakes them), and who uses each claim (the partition
    metric's Pods and containers, users.py)

No device-plugin socket is served and no device-plugin board is built: kubelet learns about our
devices only from the slices.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from nats.aio.client import Client

from partkeeper.config import Config
from partkeeper.errors import StartupError
from partkeeper.health import HEALTH
from partkeeper.lifecycle import Lifecycle
from services.allocator.core import build, startup
from services.allocator.core.options import Options
from services.allocator.dra import versions
from services.allocator.dra.claimwatch import ClaimWatch
from services.allocator.dra.ends import ClaimEnds
from services.allocator.dra.health import HealthFeed
from services.allocator.dra.kube import KubeError, ResourceApi
from services.allocator.dra.plugin import KubeletPlugin
from services.allocator.dra.prepare import Preparer
from services.allocator.dra.publish import SlicePublisher
from services.allocator.dra.slicewatch import SliceWatch
from services.allocator.dra.users import ClaimUsers

log = logging.getLogger(__name__)


async def serve(
    config: Config, nc: Client, options: Options, ready: asyncio.Event | None
) -> None:
    """Run the DRA allocator until cancelled (`main.serve` in DRA mode); `ready` is set once the
    plugin sockets serve."""
    # DRA hands partitions over by CDI only: the CDI strategy of device-plugin mode, always.
    config = dataclasses.replace(config, device_list_strategy="cdi")
    ctx, claims_kv = await build.context(config, nc, options)
    try:
        api = await ResourceApi.connect(config)
    except KubeError as exc:
        raise StartupError(f"DRA mode needs the API server: {exc}") from exc
    async with Lifecycle("allocator") as life:
        life.on_stop("the API client", api.close)
        document = await _supported(api)
        ends = ClaimEnds(ctx, api)
        preparer = Preparer(ctx, api, ends.wake)
        feed = HealthFeed(ctx)
        plugin = KubeletPlugin(config.kubelet_registry_dir, config.kubelet_plugins_dir, preparer,
                               feed)
        publisher = SlicePublisher(ctx, api, taints=versions.taints(document))
        users = ClaimUsers(api, config.node, ctx.changes.touch)
        await startup.start(ctx, claims_kv, life, {}, users.users)
        published = asyncio.Event()
        life.spawn("slice publisher", publisher.run(published))
        life.spawn("slice watch", SliceWatch(api, publisher).run())
        await life.until(published)
        life.spawn("device health feed", feed.run())
        await life.until(feed.ready)
        # Stopped after the tasks, in this order: the sockets, then the realisations in flight,
        # then the claims announcements they left in flight.
        life.on_stop("the audit announcements", ctx.store.drain)
        life.on_stop("the DRA calls in flight", preparer.close)
        life.on_stop("the kubelet plugin", plugin.stop)
        try:
            await plugin.start()
        except (OSError, RuntimeError) as exc:
            raise startup.unservable(
                f"the DRA plugin on {plugin.service_path} and {plugin.registration_path}", exc,
                "PK_KUBELET_PLUGINS_DIR and PK_KUBELET_REGISTRY_DIR must be the kubelet's "
                "plugins and plugins_registry directories") from exc
        claims = ClaimWatch(api, lambda: ends.held, ends.wake, users.seen)
        ends.watched = lambda: claims.synced
        life.spawn("ResourceClaim watch", claims.run())
        life.spawn("claim lifetimes", ends.run())
        life.spawn("ResourceClaim users", users.run())
        log.info("allocator ready on node %s in DRA mode: %s", config.node, plugin.service_path)
        if ready is not None:
            ready.set()
        with HEALTH.condition("kubelet registration", plugin.registration.registered.is_set), \
                HEALTH.condition("ResourceSlices published", lambda: publisher.failures == 0):
            await life.run()


async def _supported(api: ResourceApi) -> Any:
    """Refuse to start on a Kubernetes version whose slices we do not publish; the server's
    /version document."""
    try:
        document = await api.server_version()
    except KubeError as exc:
        raise StartupError(f"DRA mode needs the API server: {exc}") from exc
    refused = versions.refusal(document)
    if refused is not None:
        raise StartupError(refused)
    return document
