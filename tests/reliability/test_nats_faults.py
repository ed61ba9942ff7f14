"""The bus's bad days with the whole node running and Pods churning: nats-server killed with
SIGKILL and restarted in place at random moments, again and again; one service cut off from NATS
by a black hole (tests_support.faultproxy) while the others go on. At the end of each: every
service alive (none was restarted), Pods admitted again, nothing lost, nothing leaked, nothing
destroyed under a live Pod.

The default suite runs short strict versions; `pytest -m slow` runs the long ones the issue asks
for (20 restarts in a row, a 30 s black hole of each service).
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from partkeeper_sim.stack.launch import SERVICES
from partkeeper_sim.stack.natsserver import NatsServer
from tests_support.faultproxy import FaultProxy
from tests_support.reliability import (
    ADMITTED_AFTER,
    PROGRESS_SECONDS,
    admitted_more,
    churning,
    scene,
    settle,
)
from tests_support.rig import reconnected

pytestmark = [pytest.mark.reliability]

SHORT_RESTARTS = 3
LONG_RESTARTS = 20
SHORT_BLACK_HOLE_SECONDS = 8.0
LONG_BLACK_HOLE_SECONDS = 30.0
RECONNECT_SECONDS = 30.0


async def kill_and_restart(server: NatsServer, down: float) -> None:
    """SIGKILL (no goodbye to any client), `down` seconds away, the same port and store again."""
    proc = server.proc
    assert proc is not None
    proc.kill()
    await asyncio.to_thread(proc.wait)
    server.proc = None
    await asyncio.sleep(down)  # the outage being simulated, not a wait for anything
    await asyncio.to_thread(server.start)


async def restarts_in_a_row(times: int, seed: int) -> None:
    rng = random.Random(seed)
    async with scene() as sc:
        churn = await churning(sc, seed=seed)
        server = sc.rig.servers[0]
        for _ in range(times):
            await asyncio.sleep(rng.uniform(0.2, 3.0))  # a random moment of the churn
            await kill_and_restart(server, down=rng.uniform(0.0, 2.0))
            async with asyncio.timeout(RECONNECT_SECONDS):
                await reconnected(sc.rig)
            sc.all_alive()
        await admitted_more(sc, churn, ADMITTED_AFTER, PROGRESS_SECONDS)
        sc.all_alive()
        # An Allocate that found the server down waited for it: no Pod failed for the restart.
        assert not sc.admission_errors(), sc.admission_errors()
        await settle(sc, churn)
        sc.all_alive()


async def black_holed(service: str, seconds: float, seed: int) -> None:
    """`service` reaches NATS through a proxy that swallows everything for `seconds`."""
    store = Path(tempfile.mkdtemp(prefix="pk-nats-"))
    server = NatsServer(str(store))
    await asyncio.to_thread(server.start)
    try:
        async with FaultProxy(server.port) as proxy:
            overrides = {service: {"NATS_URL": proxy.url}}
            async with scene(servers=[server], overrides=overrides) as sc:
                churn = await churning(sc, seed=seed)
                proxy.black_hole()
                cut_at = time.monotonic()
                while time.monotonic() - cut_at < seconds:
                    sc.all_alive()
                    await asyncio.sleep(0.5)  # the outage lasts `seconds`; checked meanwhile
                proxy.heal()
                await admitted_more(sc, churn, ADMITTED_AFTER, PROGRESS_SECONDS)
                sc.all_alive()
                await settle(sc, churn)
                sc.all_alive()
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(store, ignore_errors=True)


@pytest.mark.timeout(300)
async def test_nats_server_killed_and_restarted_in_place_repeatedly() -> None:
    await restarts_in_a_row(SHORT_RESTARTS, seed=5)


@pytest.mark.timeout(300)
async def test_reclaimer_black_holed_from_nats() -> None:
    await black_holed("reclaimer", SHORT_BLACK_HOLE_SECONDS, seed=3)


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_nats_server_killed_and_restarted_in_place_20_times() -> None:
    await restarts_in_a_row(LONG_RESTARTS, seed=20)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("service", SERVICES)
async def test_service_black_holed_from_nats_for_30s(service: str) -> None:
    await black_holed(service, LONG_BLACK_HOLE_SECONDS, seed=SERVICES.index(service))
