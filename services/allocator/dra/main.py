"""The allocator in DRA mode: what it runs, in start-up order, on the runtime kit (`Lifecycle`).

    Pod view and claims watch (the same as device-plugin mode) -> pk-allocator micro service ->
    capacity recompute (pk-capacity, for status and metrics) -> hardware poll ->
    ResourceSlice publisher and the watch of its slices (first publication awaited) ->
    kubelet plugin sockets -> ResourceClaim watch and claim lifetimes (release once a
    ResourceClaim's use ends; the watch wakes them)

No device-plugin socket is served and no device-plugin board is built: kubelet learns about our
devices only from the slices.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from nats.aio.client import Client

from partkeeper.config import Config
from partkeeper.errors import StartupError
from partkeeper.health import HEALTH
from partkeeper.lifecycle import Lifecycle
from schemas.names import BUCKET_CAPACITY
from services.allocator import build, claims_service
from services.allocator.dra import versions
from services.allocator.dra.claimwatch import ClaimWatch
from services.allocator.dra.ends import ClaimEnds
from services.allocator.dra.kube import KubeError, ResourceApi
from services.allocator.dra.plugin import KubeletPlugin
from services.allocator.dra.prepare import Preparer
from services.allocator.dra.publish import SlicePublisher
from services.allocator.dra.slicewatch import SliceWatch
from services.allocator.options import Options
from services.allocator.recompute import Recompute, watch_claims

log = logging.getLogger(__name__)


async def serve(
    config: Config,
    nc: Client,
    *,
    ready: asyncio.Event | None = None,
    options: Options | None = None,
) -> None:
    """Run the DRA allocator until cancelled; `ready` is set once the plugin sockets serve."""
    # DRA hands partitions over by CDI only: the CDI strategy of device-plugin mode, always.
    config = dataclasses.replace(config, device_list_strategy="cdi")
    ctx, claims_kv = await build.context(config, nc, options or Options())
    try:
        api = await ResourceApi.connect(config)
    except KubeError as exc:
        raise StartupError(f"DRA mode needs the API server: {exc}") from exc
    async with Lifecycle("allocator") as life:
        life.on_stop("the API client", api.close)
        await _supported(api)
        life.on_stop("the pod-resources client", ctx.podres.close)
        ends = ClaimEnds(ctx, api)
        preparer = Preparer(ctx, api, ends.wake)
        plugin = KubeletPlugin(config.kubelet_registry_dir, config.kubelet_plugins_dir, preparer)
        publisher = SlicePublisher(ctx, api)
        loaded, claims_seen, computed, published = (asyncio.Event() for _ in range(4))
        life.spawn("pod view", ctx.pods.run(loaded))
        life.spawn("claims watch", watch_claims(ctx, claims_kv, claims_seen))
        await life.until(loaded)
        await life.until(claims_seen)
        service = await claims_service.start(nc, ctx.node, ctx.store, [c.index for c in ctx.cards])
        life.on_stop("the claims.query service", service.stop)
        recompute = Recompute(ctx, {}, await ctx.js.key_value(BUCKET_CAPACITY))
        life.spawn("recompute", recompute.run(computed))
        ctx.changes.touch()
        await life.until(computed)
        life.spawn("hardware poll", recompute.poll_hardware())
        life.spawn("slice publisher", publisher.run(published))
        life.spawn("slice watch", SliceWatch(api, publisher).run())
        await life.until(published)
        # Stopped after the tasks, in this order: the sockets, then the realisations in flight,
        # then the claims announcements they left in flight.
        life.on_stop("the audit announcements", ctx.store.settle)
        life.on_stop("the DRA calls in flight", preparer.close)
        life.on_stop("the kubelet plugin", plugin.stop)
        await _serve_plugin(plugin)
        claims = ClaimWatch(api, lambda: ends.held, ends.wake)
        ends.watched = lambda: claims.synced
        life.spawn("ResourceClaim watch", claims.run())
        life.spawn("claim lifetimes", ends.run())
        log.info("allocator ready on node %s in DRA mode: %s", config.node, plugin.service_path)
        if ready is not None:
            ready.set()
        with HEALTH.condition("kubelet registration", plugin.registration.registered.is_set), \
                HEALTH.condition("ResourceSlices published", lambda: publisher.failures == 0):
            await life.run()


async def _supported(api: ResourceApi) -> None:
    """Refuse to start on a Kubernetes version whose slices we do not publish."""
    try:
        document = await api.server_version()
    except KubeError as exc:
        raise StartupError(f"DRA mode needs the API server: {exc}") from exc
    refused = versions.refusal(document)
    if refused is not None:
        raise StartupError(refused)


async def _serve_plugin(plugin: KubeletPlugin) -> None:
    """Serve the plugin sockets; a directory we cannot bind in is a deployment error."""
    try:
        await plugin.start()
    except (OSError, RuntimeError) as exc:
        raise StartupError(
            f"cannot serve the DRA plugin on {plugin.service_path} and "
            f"{plugin.registration_path}: {exc}. PK_KUBELET_PLUGINS_DIR and "
            "PK_KUBELET_REGISTRY_DIR must be the kubelet's plugins and plugins_registry "
            "directories, mounted read-write into a container running as root"
        ) from exc
