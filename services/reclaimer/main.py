"""The reclaimer service: wiring of the Pod-event consumer, `reclaim.now` and the reconcile loop.

`serve(config, nc)` is the in-process entry (tests, the embedded stack); `main()` is the process
entry (`partkeeper run reclaimer`, `python -m services.reclaimer`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client

from partkeeper import __version__, backoff, runtime
from partkeeper.bus import ConsumerRunner
from partkeeper.bus import serve as serve_rpc
from partkeeper.bus.kv import Bucket
from partkeeper.bus.rpc import Endpoint
from partkeeper.claims import ClaimsStore, boot
from partkeeper.config import Config
from partkeeper.drivers import DriverError
from partkeeper.lifecycle import Lifecycle
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


async def serve(
    config: Config, nc: Client, *, ready: asyncio.Event | None = None, tuning: Tuning = DEFAULT
) -> None:
    """Run the reclaimer on `nc` until cancelled; `ready` is set once its endpoint answers."""
    js = nc.jetstream()
    store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), config.node, announce=True)
    driver = await runtime.open_driver(config)
    ctx = Context(config, nc, js, store, driver, Audit(js, config.node, store), tuning)
    jobs = Jobs(ctx)
    consumer = ConsumerRunner(
        js,
        service=NAME,
        stream=STREAM_PODS,
        durable=durable_name(NAME, config.node),
        filter_subject=pods_filter(config.node),
        decode=_decode_pod_event,
        handle=PodEventHandler(ctx, jobs),
        dlq_subject=dlq_subject(config.node, NAME),
        spec=POD_EVENTS_CONSUMER,
        lag_every=max(config.resync_seconds, 5.0),
    )
    await consumer.ensure()
    async with Lifecycle(NAME) as life:
        life.on_stop("the audit announcements", store.drain)  # after the jobs' last writes
        life.on_stop("destroy jobs", jobs.close)
        service = await serve_rpc(
            nc, name=SERVICE_RECLAIMER, version=__version__,
            description=f"destroys partitions of finished Pods on {config.node}",
            endpoints=[Endpoint("reclaim-now", reclaim_now_subject(config.node), ReclaimNow,
                                ReclaimNowHandler(ctx, jobs))],
        )
        life.on_stop("the reclaim.now service", service.stop)
        # The boot first (docs/reclaimer.md, "After a reboot"): after a reboot, no claim is
        # judged before the partitions it removed are marked. `reclaim.now` answers meanwhile.
        settled = asyncio.Event()
        life.spawn("reconcile", _after_boot(ctx, settled, Reconciler(ctx, jobs).run))
        life.spawn("pod events", _after(settled, consumer.run))
        log.info("reclaimer ready on node %s", config.node)
        if ready is not None:
            ready.set()
        await life.run()


async def _after_boot(ctx: Context, settled: asyncio.Event,
                      then: Callable[[], Awaitable[None]]) -> None:
    """Record the host's boot on every card's claims (the cards asked again while the driver
    cannot list them: never taken as none), then run `then`."""
    cards = await backoff.retry("enumerating the cards", ctx.cards,
                                transient=lambda exc: isinstance(exc, DriverError),
                                schedule=backoff.Schedule(0.5, 10.0))
    await boot.settle(ctx.store, cards, ctx.config.proc_root)
    settled.set()
    await then()


async def _after(settled: asyncio.Event, then: Callable[[], Awaitable[None]]) -> None:
    await settled.wait()
    await then()


def main() -> int:
    return runtime.run(NAME, serve)
