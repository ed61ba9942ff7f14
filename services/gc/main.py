"""Entry points of the GC: `serve` (in-process, for tests and the embedded stack) and `main`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nats.aio.client import Client

from partkeeper import runtime, workdir
from partkeeper.bus import ConsumerRunner
from partkeeper.config import Config
from partkeeper.telemetry import metrics
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
        stream=STREAM_PODS,
        durable=durable_name(SERVICE, config.node),
        filter_subject=pods_filter(config.node),
        decode=events.decode_event,
        handle=events.handler(collector),
        dlq_subject=dlq_subject(config.node, SERVICE),
        on_dead_letter=lambda _error: metrics.DEAD_LETTERS.labels(SERVICE, STREAM_PODS).inc(),
    )
    await runner.ensure()
    log.info("gc serving node %s, pods dir %s, sweep every %gs",
             config.node, config.pods_dir, config.resync_seconds)
    async with asyncio.TaskGroup() as group:
        group.create_task(runner.run(), name="gc-consumer")
        group.create_task(sweep.run(collector, config.resync_seconds), name="gc-sweep")
        group.create_task(_report_lag(runner, config.resync_seconds), name="gc-lag")
        if ready is not None:
            ready.set()


async def _report_lag(runner: ConsumerRunner[Any], period: float) -> None:
    while True:
        sweep.honour_cancel()
        try:
            metrics.CONSUMER_LAG.labels(runner.durable).set(await runner.lag())
        except Exception as exc:  # a metric must never stop the service
            log.debug("consumer lag unavailable: %s", exc)
        await asyncio.sleep(max(period, 5.0))


def main() -> int:
    return runtime.run(SERVICE, serve)
