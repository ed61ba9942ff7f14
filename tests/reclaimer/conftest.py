"""Fixtures: a sim node (two A100-40GB cards), the stand-in watcher, the audit log, a reclaimer."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper_sim.driver import SimDriver, init_state
from partkeeper_sim.stack.natsserver import NatsServer
from services.reclaimer.main import serve
from services.reclaimer.tuning import Tuning
from tests_support.reclaimer import FAST, MODEL, AuditLog, FakeWatcher, Hands

StartReclaimer = Callable[..., Awaitable[asyncio.Task[None]]]


@pytest.fixture
def sim_state(tmp_path: Path) -> Path:
    path = tmp_path / "sim.json"
    init_state(path, [MODEL, MODEL], [])
    return path


@pytest.fixture
def config(nats_server: NatsServer, node: str, sim_state: Path, tmp_path: Path) -> Config:
    return Config(
        nats_urls=(nats_server.url,), node=node, driver="sim", sim_state=sim_state,
        pods_dir=tmp_path / "pods", resync_seconds=0.2, metrics_port=0,
    )


@pytest.fixture
async def hands(js, config: Config, sim_state: Path) -> Hands:
    store = ClaimsStore(await Bucket.open(js, "pk-claims"), config.node)
    return Hands(js, store, SimDriver(sim_state), config.pods_dir, config.node)


@pytest.fixture
async def watcher(nc: Client, node: str) -> AsyncIterator[FakeWatcher]:
    fake = await FakeWatcher().start(nc, node)
    yield fake
    await fake.stop()


@pytest.fixture
async def audit(nc: Client, node: str) -> AsyncIterator[AuditLog]:
    log = await AuditLog().start(nc, node)
    yield log
    await log.stop()


@pytest.fixture
async def start_reclaimer(nc: Client, js, config: Config) -> AsyncIterator[StartReclaimer]:
    """Start `serve` in this process (config fields may be overridden); stopped at the end."""
    tasks: list[asyncio.Task[None]] = []

    # Config fields by name: a bag of keywords mypy cannot type per field; `replace` refuses an
    # unknown name when the test runs.
    async def start(tuning: Tuning = FAST, **overrides: Any) -> asyncio.Task[None]:
        ready = asyncio.Event()
        cfg = dataclasses.replace(config, **overrides)
        task = asyncio.create_task(serve(cfg, nc, ready=ready, tuning=tuning))
        tasks.append(task)
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({task, waiter}, timeout=10,
                                     return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        if task in done:
            task.result()
        assert ready.is_set(), "the reclaimer did not become ready"
        return task

    yield start
    crashed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert not crashed, f"the reclaimer crashed during the test: {crashed[0].exception()!r}"
