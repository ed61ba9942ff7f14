"""Observability fixtures: the simulated API server, the watcher in-process or as a process, and
an OTLP receiver."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from observability.obs_harness import WatcherProcess, spawn_watcher
from observability.otlp_receiver import OtlpReceiver
from watcher.watcher_harness import FAST, RunningWatcher, until

from partkeeper.config import Config
from partkeeper.sim.apiserver import ApiServerThread, write_kubeconfig
from partkeeper.stack.natsserver import NatsServer
from services.watcher.main import serve
from services.watcher.tuning import Tuning

# Short retries so the bounded-retry paths of the Event recorder run in milliseconds.
EVENTS_FAST = dataclasses.replace(
    FAST, event_attempts=4, event_retry_base=0.02, event_retry_cap=0.2, lag_interval=0.5
)


@pytest.fixture
def apiserver() -> Iterator[ApiServerThread]:
    server = ApiServerThread(bookmark_interval=0.05).start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(apiserver: ApiServerThread, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)


@pytest.fixture
def config(nats_server: NatsServer, node: str, kubeconfig: Path) -> Config:
    return Config(nats_urls=(nats_server.url,), node=node, kubeconfig=str(kubeconfig))


@pytest.fixture
async def start_watcher(
    nc: Client, js: JetStreamContext, config: Config, apiserver: ApiServerThread
) -> AsyncIterator[Callable[..., Any]]:
    """Start the watcher in-process and wait until it is ready; all are stopped at the end."""
    running: list[RunningWatcher] = []

    async def start(tuning: Tuning = EVENTS_FAST) -> RunningWatcher:
        ready = asyncio.Event()
        task = asyncio.create_task(serve(config, nc, ready=ready, tuning=tuning), name="watcher")
        watcher = RunningWatcher(task, ready)
        running.append(watcher)
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({task, waiter}, timeout=15,
                                     return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task in done:
            task.result()
        assert ready.is_set(), "the watcher did not become ready within 15s"
        await until(lambda: apiserver.open_watches() > 0, 10, "the watcher's watch")
        return watcher

    yield start
    for watcher in running:
        await watcher.stop()


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    async with OtlpReceiver() as started:
        yield started


@pytest.fixture
async def spawn(
    nats_server: NatsServer, node: str, kubeconfig: Path, tmp_path: Path
) -> AsyncIterator[Callable[..., Any]]:
    """Start `python -m services.watcher` with extra environment; every one is killed at the
    end if it is still running."""
    started: list[WatcherProcess] = []

    async def start(**env: str) -> WatcherProcess:
        process = await spawn_watcher(
            nats_url=nats_server.url, node=node, kubeconfig=kubeconfig,
            log=tmp_path / f"watcher-{len(started)}.log", env=env,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        await process.kill()


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
