"""Fixtures of the reliability tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from partkeeper_sim.stack.natsserver import NatsServer
from tests_support.access import CONFIG


@pytest.fixture
def server() -> Iterator[NatsServer]:
    """A fresh nats-server with the shipped configuration (compose/nats/nats.conf), unprovisioned:
    the test's stack provisions it as a deployment does."""
    running = NatsServer(config=str(CONFIG)).start()
    yield running
    running.stop()
    shutil.rmtree(running.store_dir, ignore_errors=True)
