"""Fixtures for the simulated API server: one server per test, reached by the real client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests_support.kubeclient import WatchRecorder, core_v1


@pytest.fixture
def core(kubeconfig: Path) -> Iterator[client.CoreV1Api]:
    api = core_v1(kubeconfig)
    yield api
    api.api_client.close()


@pytest.fixture
def record_watch() -> Iterator[Callable[..., WatchRecorder]]:
    """Start a WatchRecorder; every one started is stopped when the test ends."""
    recorders: list[WatchRecorder] = []

    def start(func: Callable[..., Any], *args: Any, **kwargs: Any) -> WatchRecorder:
        recorder = WatchRecorder(func, *args, **kwargs).start()
        recorders.append(recorder)
        return recorder

    yield start
    for recorder in recorders:
        recorder.stop()
