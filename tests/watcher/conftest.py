"""Watcher fixtures: the simulated API server, a running watcher, the events it published."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from watcher.watcher_harness import FAST, Published, RunningWatcher, until

from partkeeper.config import Config
from partkeeper.sim.apiserver import ApiServerThread
from partkeeper.stack.natsserver import NatsServer
from schemas.names import pods_filter
from services.watcher.main import serve
from services.watcher.tuning import Tuning


@pytest.fixture
def config(nats_server: NatsServer, node: str, kubeconfig: Path) -> Config:
    return Config(nats_urls=(nats_server.url,), node=node, kubeconfig=str(kubeconfig))


@pytest.fixture
async def published(js: JetStreamContext, node: str) -> AsyncIterator[Published]:
    seen = Published()
    sub = await js.subscribe(pods_filter(node), cb=seen.on_msg, ordered_consumer=True)
    yield seen
    await sub.unsubscribe()


@pytest.fixture
async def start_watcher(
    nc: Client, js: JetStreamContext, config: Config, apiserver: ApiServerThread
) -> AsyncIterator[Callable[..., Any]]:
    """Start the watcher in-process (as the embedded stack does) and wait until it is ready and
    its watch is open (so a test that stalls the watch stalls it); all are stopped at the end."""
    running: list[RunningWatcher] = []

    async def start(*, wait_ready: bool = True, tuning: Tuning = FAST) -> RunningWatcher:
        ready = asyncio.Event()
        task = asyncio.create_task(serve(config, nc, ready=ready, tuning=tuning), name="watcher")
        watcher = RunningWatcher(task, ready)
        running.append(watcher)
        if wait_ready:
            waiter = asyncio.create_task(ready.wait())
            done, _ = await asyncio.wait(
                {task, waiter}, timeout=15, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            if task in done:
                task.result()
            assert ready.is_set(), "the watcher did not become ready within 15s"
            await until(lambda: apiserver.open_watches() > 0, 10, "the watcher's watch")
        return watcher

    yield start
    for watcher in running:
        await watcher.stop()


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
