"""Observability fixtures: an OTLP receiver (the simulated API server and the watcher, in-process
or as a process: tests/conftest.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from tests_support.otlp_receiver import OtlpReceiver


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    async with OtlpReceiver() as started:
        yield started


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
