"""The reclaimer service: wiring of the Pod-event consumer, `reclaim.now` and the reconcile loop.

`serve(config, nc)` is the in-process entry (tests, the embedded stack); `main()` is the process
entry (`partkeeper run reclaimer`, `python -m services.reclaimer`).
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client

from partkeeper import __version__, runtime
from partkeeper.bus import ConsumerRunner
from partkeeper.bus import serve as serve_rpc
from partkeeper.bus.rpc import Endpoint
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers import open_driver
from partkeeper.lifecycle import cancel_all
from partkeeper.telemetry import metrics
from schemas import PodEvent, ReclaimNow, decode
from schemas.names import (
    BUCKET_CLAIMS,
    SERVICE_RECLAIMER,
    STREAM_PODS,
    dlq_subject,
    durable_name,
    pods_filter,
    reclaim_now_subject,
)
from services.reclaimer.audit import Audit
from services.reclaimer.context import Context
from services.reclaimer.events import PodEventHandler
from services.reclaimer.jobs import Jobs
from services.reclaimer.now import ReclaimNowHandler
from services.reclaimer.reconcile import Reconciler
from services.reclaimer.tuning import DEFAULT, POD_EVENTS_CONSUMER, Tuning

NAME = "reclaimer"
log = logging.getLogger(__name__)


def _decode_pod_event(data: bytes) -> PodEvent:
    return decode(data, PodEvent, what="pod event")


def _dead_letter(_error: str) -> None:
    metrics.DEAD_LETTERS.labels(service=NAME, stream=STREAM_PODS).inc()


async def serve(
    config: Config, nc: Client, *, ready: asyncio.Event | None = None, tuning: Tuning = DEFAULT
) -> None:
    """Run the reclaimer on `nc` until cancelled; `ready` is set once its endpoint answers."""
    js = nc.jetstream()
    store = ClaimsStore(await js.key_value(BUCKET_CLAIMS), config.node)
    ctx = Context(config, nc, js, store, open_driver(config), Audit(js, config.node), tuning)
    jobs = Jobs(ctx)
    reconciler = Reconciler(ctx, jobs)
    consumer = ConsumerRunner(
        js,
        stream=STREAM_PODS,
        durable=durable_name(NAME, config.node),
        filter_subject=pods_filter(config.node),
        decode=_decode_pod_event,
        handle=PodEventHandler(ctx, jobs),
        dlq_subject=dlq_subject(config.node, NAME),
        spec=POD_EVENTS_CONSUMER,
        on_dead_letter=_dead_letter,
    )
    await consumer.ensure()
    service = await serve_rpc(
        nc, name=SERVICE_RECLAIMER, version=__version__,
        description=f"destroys partitions of finished Pods on {config.node}",
        endpoints=[Endpoint("reclaim-now", reclaim_now_subject(config.node), ReclaimNow,
                            ReclaimNowHandler(ctx, jobs))],
    )
    tasks = [
        asyncio.create_task(reconciler.run(), name="reclaimer-reconcile"),
        asyncio.create_task(consumer.run(), name="reclaimer-pod-events"),
        asyncio.create_task(_report_lag(consumer, config.resync_seconds), name="reclaimer-lag"),
    ]
    log.info("reclaimer ready on node %s", config.node)
    if ready is not None:
        ready.set()
    try:
        # Not gather: a cancelled gather waits for its children, and one of them may need a
        # second cancel (partkeeper.lifecycle). A task that ends by itself has failed: re-raise it.
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        raise RuntimeError(f"reclaimer task {next(iter(done)).get_name()} ended by itself")
    finally:
        await cancel_all(tasks)
        await jobs.close()
        await service.stop()


async def _report_lag(consumer: ConsumerRunner[PodEvent], every: float) -> None:
    gauge = metrics.CONSUMER_LAG.labels(consumer=consumer.durable)
    while True:
        try:
            gauge.set(await consumer.lag())
        except Exception as exc:  # a metric must never stop the service
            log.debug("consumer lag unavailable: %s", exc)
        await asyncio.sleep(max(every, 5.0))


def main() -> int:
    return runtime.run(NAME, serve)
