"""What a service logs about its NATS connection: a lost connection is a warning (the client
reconnects), a close the service asked for is not (nats-py calls the disconnect callback on both).
"""

from __future__ import annotations

import logging

import pytest

from partkeeper.bus.connection import connect
from partkeeper.config import Config
from partkeeper_sim.stack.natsserver import NatsServer
from tests_support import until
from tests_support.faultproxy import FaultProxy

pytestmark = pytest.mark.timeout(60)
LOST = "nats disconnected; reconnecting"


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "partkeeper.bus.connection" and r.levelno >= logging.WARNING]


async def test_closing_the_connection_logs_no_disconnect(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="partkeeper.bus.connection")
    nc = await connect(Config(nats_urls=(nats_server.url,), node="n"), "watcher")
    await nc.close()
    assert warnings(caplog) == []


async def test_a_lost_connection_is_a_warning(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="partkeeper.bus.connection")
    async with FaultProxy(nats_server.port) as proxy:
        nc = await connect(Config(nats_urls=(proxy.url,), node="n"), "watcher")
        try:
            proxy.drop()
            await until(lambda: LOST in warnings(caplog), "the disconnect warning", 20)
            proxy.heal()
            await until(lambda: nc.is_connected, "the reconnection", 20)
        finally:
            await nc.close()
