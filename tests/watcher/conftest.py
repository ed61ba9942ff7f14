"""Watcher fixtures: the events a watcher published (the watcher itself: tests/conftest.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from nats.js import JetStreamContext

from schemas.names import pods_filter
from tests_support.watcher import Published


@pytest.fixture
async def published(js: JetStreamContext, node: str) -> AsyncIterator[Published]:
    seen = Published()
    sub = await js.subscribe(pods_filter(node), cb=seen.on_msg, ordered_consumer=True)
    yield seen
    await sub.unsubscribe()


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
