"""Observability fixtures: the watcher as a process, and an OTLP receiver (the simulated API
server and the in-process watcher: tests/conftest.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from observability.obs_harness import WatcherProcess, spawn_watcher
from observability.otlp_receiver import OtlpReceiver

from partkeeper.stack.natsserver import NatsServer


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
