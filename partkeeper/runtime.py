"""How a service process starts and stops: config, logs, tracing, metrics, signals, NATS.

`run(name, body)` exits non-zero only when the service cannot start here (a `StartupError`: bad
configuration, no driver library, a metrics port taken), after one JSON log line saying why. It
exits 0 after SIGTERM/SIGINT. Anything else, a NATS server that restarts, a cluster electing its
leaders, a bug that ends `body`, is logged and outlived: the connection reconnects by itself, the
service waits (not ready) until `partkeeper provision` has created the streams, and a `body` that
fails is started again after a backoff, on the same connection (what Kubernetes would do by
restarting the container, without losing the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from nats.aio.client import Client

from partkeeper import backoff, bus, drivers, heap
from partkeeper.config import Config, load
from partkeeper.drivers import Driver
from partkeeper.errors import StartupError
from partkeeper.faults import FaultSpecError
from partkeeper.health import HEALTH
from partkeeper.lifecycle import cancel_all, stop_on_signals, woken_or_timeout
from partkeeper.telemetry import logs, metrics, tracing

log = logging.getLogger(__name__)

ServiceBody = Callable[..., Coroutine[Any, Any, None]]  # body(config, nc, *, ready: asyncio.Event)
START_UP_EXIT = 2
HEALTHY_SECONDS = 60.0  # a body that ran this long starts again at the first backoff step


async def open_driver(config: Config) -> Driver:
    """The configured driver, opened in a worker thread as every driver call is made
    (docs/protocol.md): opening loads the vendor library and may walk the cards, which blocks,
    and a service's event loop keeps its NATS heartbeats and endpoints answering meanwhile.
    Raises what `drivers.open_driver` raises (a StartupError when the library is missing)."""
    return await asyncio.to_thread(drivers.open_driver, config)


def run(name: str, body: ServiceBody) -> int:
    """Run `body(config, nats)` until SIGTERM/SIGINT (module docstring)."""
    logs.setup(name)
    try:
        config = load()
        drivers.require_installed(config.driver)  # PK_DRIVER=sim without the simulator
        tracing.setup(name)
        try:
            metrics.serve(config.metrics_port_for(name))
        except OSError as exc:
            raise StartupError(f"metrics port {config.metrics_port_for(name)}: {exc}") from exc
        asyncio.run(_main(name, config, body))
    except (StartupError, FaultSpecError) as exc:
        log.error("partkeeper %s: %s", name, exc, extra={"startup_error": type(exc).__name__})
        return START_UP_EXIT
    finally:
        tracing.shutdown()
    return 0


async def _main(name: str, config: Config, body: ServiceBody) -> None:
    stop = stop_on_signals()
    nc = await connect_until_ready(config, name, stop)
    if nc is None:
        return
    try:
        if not await topology_until_ready(nc, config, stop):
            return
        ready = asyncio.Event()

        def start() -> Awaitable[None]:
            ready.clear()  # a body started again is not ready until it says so
            return body(config, nc, ready=ready)

        beat = asyncio.create_task(HEALTH.beat(), name=f"{name}-heartbeat")
        frozen = asyncio.create_task(_freeze_when_ready(name, ready), name=f"{name}-heap")
        with (
            HEALTH.condition("nats", lambda: nc.is_connected),
            HEALTH.condition(name, ready.is_set),
        ):
            await supervise(name, start, stop)
        await cancel_all((beat, frozen))
    finally:
        with contextlib.suppress(Exception):
            await nc.drain()


async def _freeze_when_ready(name: str, ready: asyncio.Event) -> None:
    """Once the first start is done, what it built is the process's for good (`heap`)."""
    await ready.wait()
    log.info("%s ready; %d objects of its start exempted from garbage collection", name,
             heap.freeze_startup())


async def supervise(name: str, body: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
    """Run `body` until `stop` is set; a failure other than StartupError starts it again."""
    loop = asyncio.get_running_loop()
    attempt = 0
    while not stop.is_set():
        started = loop.time()
        task = asyncio.ensure_future(body())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            log.info("%s stopping", name)
            await cancel_all((task, stopper))
            return
        await cancel_all((stopper,))
        problem = _failure(task)
        attempt = 1 if loop.time() - started > HEALTHY_SECONDS else attempt + 1
        wait = backoff.delay(attempt, base=0.5, cap=15.0)
        log.error("%s: %s; starting it again in %.1fs", name, problem, wait,
                  exc_info=task.exception() if not task.cancelled() else None)
        await woken_or_timeout(stop, wait)


def _failure(task: asyncio.Future[None]) -> str:
    if task.cancelled():
        return "the service was cancelled from inside"
    error = task.exception()
    if isinstance(error, StartupError):
        raise error
    if error is None:
        return "the service ended by itself"
    return f"the service failed: {str(error) or type(error).__name__}"


async def topology_until_ready(nc: Client, config: Config, stop: asyncio.Event) -> bool:
    """Wait until the streams and buckets exist (`partkeeper provision` creates them; a service
    never does), retrying while JetStream cannot answer yet. Not ready meanwhile, one line per
    look saying what is missing. False if told to stop first."""
    failures = backoff.Failures(f"{config.node}: the streams and buckets",
                                backoff.Schedule(0.5, 10.0))
    while not stop.is_set():
        try:
            missing = await bus.missing_topology(nc.jetstream())
        except Exception as exc:
            problem = f"JetStream not ready ({exc or type(exc).__name__})"
        else:
            if not missing:
                return True
            problem = (f"not ready: waiting for `partkeeper provision` to create "
                       f"{', '.join(missing)}")
        await woken_or_timeout(stop, failures.failed(problem, "looking again"))
    return False


async def connect_until_ready(config: Config, name: str, stop: asyncio.Event) -> Client | None:
    """Connect to NATS (the client retries unreachable servers itself) unless told to stop first."""
    connecting = asyncio.create_task(bus.connect(config, name), name=f"{name}-connect")
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if connecting.done():
        return connecting.result()
    log.warning("stopped before NATS at %s answered", ",".join(config.nats_urls))
    connecting.cancel()
    await asyncio.gather(connecting, stopping, return_exceptions=True)
    return None
