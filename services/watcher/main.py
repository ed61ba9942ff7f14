"""The watcher service: the only source of Pod truth on its node.

`serve(config, nc)` runs it in-process (tests, the embedded stack); `main()` is the container
entrypoint (`partkeeper run watcher`, `python -m services.watcher`).
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client

import partkeeper
from partkeeper import backoff, bus, runtime
from partkeeper.config import Config
from partkeeper.lifecycle import Lifecycle
from schemas.names import BUCKET_PODS, SERVICE_WATCHER
from services.watcher import node_note
from services.watcher.kube import Kube
from services.watcher.pods import Resources
from services.watcher.queries import Queries
from services.watcher.recorder import EventRecorder
from services.watcher.sync import Sync
from services.watcher.tuning import Tuning
from services.watcher.view import PodView, ViewError

log = logging.getLogger(__name__)


async def serve(
    config: Config,
    nc: Client,
    *,
    ready: asyncio.Event | None = None,
    tuning: Tuning | None = None,
) -> None:
    """Run until cancelled. `ready` is set once the persisted view is loaded, the endpoints
    answer and the first LIST is applied."""
    tuning = tuning or Tuning()
    js = nc.jetstream()
    view = PodView(js, await js.key_value(BUCKET_PODS), config.node)
    await _load(view, tuning)
    kube = await Kube.connect(config, request_timeout=tuning.request_timeout)
    sync = Sync(kube, view, Resources(config.resource_prefix, config.sliced_resource), tuning)
    queries = Queries(kube, view, sync, sync.resources)
    async with Lifecycle("watcher") as life:
        life.on_stop("the API client", lambda: asyncio.to_thread(kube.close))
        life.on_stop("the watch threads", sync.stop)
        service = await bus.serve(
            nc,
            name=SERVICE_WATCHER,
            version=partkeeper.__version__,
            description=f"Pod truth for node {config.node}: pods.get, pods.pending",
            endpoints=queries.endpoints(),
        )
        life.on_stop("the pods.get service", service.stop)
        log.info("watcher of node %s serving; %d Pod records loaded", config.node,
                 len(view.records()))
        life.spawn("sync", sync.run(ready))
        life.spawn("prune", _prune(view, tuning))
        life.spawn("events", EventRecorder(js, kube, view, tuning).run())
        life.spawn("node note", node_note.keep(kube, config.slice_limiter))
        await life.run()


async def _load(view: PodView, tuning: Tuning) -> None:
    """Load the persisted view; without it the watcher would re-announce or forget, so it waits."""
    count = await backoff.retry(
        f"loading the Pod records of {BUCKET_PODS}", view.load,
        transient=_view_error,
        schedule=backoff.Schedule(tuning.retry_base, tuning.retry_cap),
    )
    log.info("loaded %d Pod records from %s", count, BUCKET_PODS)


async def _prune(view: PodView, tuning: Tuning) -> None:
    """Forget tombstones older than the TTL, now and then periodically (a failure: next pass)."""

    async def prune() -> None:
        removed = await view.prune(tuning.tombstone_ttl)
        if removed:
            log.info("pruned %d tombstones older than %.0fs", removed, tuning.tombstone_ttl)

    await backoff.every("pruning tombstones", tuning.prune_interval, prune,
                        transient=_view_error, schedule=lambda _failures: tuning.prune_interval)


def _view_error(exc: Exception) -> bool:
    return isinstance(exc, ViewError)


def main() -> int:
    return runtime.run("watcher", serve)
