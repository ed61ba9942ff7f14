"""Entry points of the GC: `serve` (in-process, for tests and the embedded stack) and `main`."""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client

from partkeeper import runtime, workdir
from partkeeper.bus import ConsumerRunner
from partkeeper.config import Config
from partkeeper.lifecycle import Lifecycle
from schemas.names import STREAM_PODS, dlq_subject, durable_name, pods_filter
from services.gc import events, sweep
from services.gc.collect import Collector

log = logging.getLogger(__name__)

SERVICE = "gc"


async def serve(
    config: Config,
    nc: Client,
    *,
    ready: asyncio.Event | None = None,
    device_of: workdir.DeviceOf = workdir.st_device,
) -> None:
    """Run the GC until cancelled: the PK_PODS consumer and the periodic sweep.

    `ready` is set once the durable consumer exists. `device_of` is a test seam standing in for
    st_dev, to stage "another filesystem" without a mount.
    """
    collector = Collector(config, nc, device_of=device_of)
    runner = ConsumerRunner(
        nc.jetstream(),
        service=SERVICE,
        stream=STREAM_PODS,
        durable=durable_name(SERVICE, config.node),
        filter_subject=pods_filter(config.node),
        decode=events.decode_event,
        handle=events.handler(collector),
        dlq_subject=dlq_subject(config.node, SERVICE),
        lag_every=max(config.resync_seconds, 5.0),
    )
    await runner.ensure()
    log.info("gc serving node %s, pods dir %s, sweep every %gs",
             config.node, config.pods_dir, config.resync_seconds)
    async with Lifecycle(SERVICE) as life:
        life.spawn("consumer", runner.run())
        life.spawn("sweep", sweep.run(collector, config.resync_seconds))
        if ready is not None:
            ready.set()
        await life.run()


def main() -> int:
    return runtime.run(SERVICE, serve)
