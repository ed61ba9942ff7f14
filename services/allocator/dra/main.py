"""The allocator in DRA mode: what it runs, in start-up order.

    Pod view and claims watch (the same as device-plugin mode) -> pk-allocator micro service ->
    capacity recompute (pk-capacity, for status and metrics) -> hardware poll ->
    ResourceSlice publisher (first publication awaited) -> kubelet plugin sockets

No device-plugin socket is served: kubelet learns about our devices only from the slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Coroutine
from typing import Any

from nats.aio.client import Client

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers import open_driver
from partkeeper.errors import StartupError
from partkeeper.health import HEALTH
from schemas.names import BUCKET_CAPACITY, BUCKET_CLAIMS, BUCKET_PODS
from services.allocator import catalog, claims_service
from services.allocator.changes import Changes
from services.allocator.context import Context
from services.allocator.dra.kube import KubeError, ResourceApi
from services.allocator.dra.plugin import KubeletPlugin
from services.allocator.dra.prepare import Preparer
from services.allocator.dra.publish import SlicePublisher
from services.allocator.main import _cards as enumerate_cards
from services.allocator.options import Options
from services.allocator.plugin import Board
from services.allocator.podresources import PodResources
from services.allocator.podview import PodView
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
    options = options or Options()
    # DRA hands partitions over by CDI only: the CDI strategy of device-plugin mode, always.
    config = dataclasses.replace(config, device_list_strategy="cdi")
    driver = options.driver
    if driver is None:
        driver = await asyncio.to_thread(open_driver, config)
    cards = await enumerate_cards(driver)
    js = nc.jetstream()
    claims = await Bucket.open(js, BUCKET_CLAIMS)
    claims_kv = claims.kv
    changes = Changes()
    offers = catalog.offers(cards, prefix=config.resource_prefix,
                            sliced_resource=config.sliced_resource,
                            slices_per_card=config.slices_per_card)
    ctx = Context(config=config, nc=nc, js=js,
                  store=ClaimsStore(claims, config.node, announce=True),
                  driver=driver, cards=cards, offers=offers,
                  pods=PodView(await js.key_value(BUCKET_PODS), config.node, changes.touch),
                  changes=changes, podres=PodResources(config.pod_resources_socket),
                  options=options)
    try:
        api = await ResourceApi.connect(config)
    except KubeError as exc:
        raise StartupError(f"DRA mode needs the API server: {exc}") from exc
    preparer = Preparer(ctx, api)
    plugin = KubeletPlugin(config.kubelet_registry_dir, config.kubelet_plugins_dir, preparer)
    tasks: list[asyncio.Task[None]] = []

    def spawn(work: Coroutine[Any, Any, None], name: str) -> None:
        tasks.append(asyncio.create_task(work, name=name))

    service = None
    publisher = SlicePublisher(ctx, api)
    try:
        loaded, claims_seen, computed, published = (asyncio.Event() for _ in range(4))
        spawn(ctx.pods.run(loaded), "allocator pod view")
        spawn(watch_claims(ctx, claims_kv, claims_seen), "allocator claims watch")
        await loaded.wait()
        await claims_seen.wait()
        service = await claims_service.start(nc, ctx.node, ctx.store, [c.index for c in cards])
        boards = {resource: Board(offer.tokens) for resource, offer in offers.items()}
        recompute = Recompute(ctx, boards, await js.key_value(BUCKET_CAPACITY))
        spawn(recompute.run(computed), "allocator recompute")
        ctx.changes.touch()
        await computed.wait()
        spawn(recompute.poll_hardware(), "allocator hardware poll")
        spawn(publisher.run(published), "allocator slice publisher")
        await published.wait()
        await _serve_plugin(plugin)
        log.info("allocator ready on node %s in DRA mode: %s", config.node, plugin.service_path)
        if ready is not None:
            ready.set()
        with HEALTH.condition("kubelet registration", plugin.registration.registered.is_set), \
                HEALTH.condition("ResourceSlices published", lambda: publisher.failures == 0):
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await plugin.stop()
        await preparer.close()
        if service is not None:
            with contextlib.suppress(Exception):
                await service.stop()
        await ctx.podres.close()
        api.close()


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
