"""How a service process starts and stops: config, logs, tracing, metrics, signals, NATS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from nats.aio.client import Client

from partkeeper import bus
from partkeeper.config import Config, ConfigError, load
from partkeeper.errors import StartupError
from partkeeper.faults import FaultSpecError
from partkeeper.health import HEALTH
from partkeeper.lifecycle import cancel_all
from partkeeper.telemetry import logs, metrics, tracing

log = logging.getLogger(__name__)

ServiceBody = Callable[..., Coroutine[Any, Any, None]]  # body(config, nc, *, ready: asyncio.Event)


def run(name: str, body: ServiceBody) -> int:
    """Run `body(config, nats)` until SIGTERM/SIGINT; exit 2 with one sentence on bad config."""
    logs.setup(name)
    try:
        config = load()
    except (ConfigError, FaultSpecError) as exc:
        print(f"partkeeper {name}: {exc}", file=sys.stderr)
        return 2
    tracing.setup(name)
    try:
        metrics.serve(config.metrics_port_for(name))
    except OSError as exc:
        print(f"partkeeper {name}: metrics port: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_main(name, config, body))
    except StartupError as exc:
        log.error("%s cannot start: %s", name, exc)
        return 2  # as for a bad setting: this process cannot run here as configured
    finally:
        tracing.shutdown()
    return 0


async def _main(name: str, config: Config, body: ServiceBody) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    nc = await connect_until_ready(config, name, stop)
    if nc is None:
        return
    try:
        if not await topology_until_ready(nc, config, stop):
            return
        ready = asyncio.Event()
        task = asyncio.create_task(body(config, nc, ready=ready), name=f"{name}-body")
        stopper = asyncio.create_task(stop.wait())
        beat = asyncio.create_task(HEALTH.beat(), name=f"{name}-heartbeat")
        with (
            HEALTH.condition("nats", lambda: nc.is_connected),
            HEALTH.condition(name, ready.is_set),
        ):
            done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # a crashed body ends the process with its error
        log.info("%s stopping", name)
        await cancel_all((task, stopper, beat))
    finally:
        with contextlib.suppress(Exception):
            await nc.drain()


async def topology_until_ready(nc: Client, config: Config, stop: asyncio.Event) -> bool:
    """Create the streams and buckets, retrying while JetStream cannot answer yet (a new cluster
    still electing its stream leaders). False if told to stop first."""
    attempt = 0
    while not stop.is_set():
        attempt += 1
        try:
            await bus.ensure_topology(nc.jetstream(), replicas=config.stream_replicas)
            return True
        except Exception as exc:
            wait = bus.backoff.delay(attempt, base=0.5, cap=10)
            log.warning("JetStream not ready (%s); creating streams again in %.1fs",
                        exc or type(exc).__name__, wait)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
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
