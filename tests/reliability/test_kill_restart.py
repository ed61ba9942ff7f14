"""Crashes nobody planned: `kill -9` of each service, and the nats-server restarted in place,
while Pods come and go. Nothing is lost (invariant 6), nothing leaks, nothing is destroyed under
a live Pod, and the node goes on admitting Pods after the restart."""

from __future__ import annotations

import pytest

from partkeeper_sim.stack.launch import SERVICES
from tests_support import reliability as rh
from tests_support.rig import reconnected

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

SIGKILL_STATUS = -9


@pytest.mark.parametrize("service", SERVICES)
async def test_kill_9_mid_churn(service: str) -> None:
    async with rh.scene() as sc:
        churn = await rh.churning(sc, seed=SERVICES.index(service))
        assert await sc.rig.kill(service) == SIGKILL_STATUS
        await sc.rig.restart(service)
        await rh.admitted_more(sc, churn, rh.ADMITTED_AFTER, rh.PROGRESS_SECONDS)
        await rh.settle(sc, churn)


async def test_nats_server_restarted_in_place_mid_churn() -> None:
    async with rh.scene() as sc:
        churn = await rh.churning(sc, seed=7)
        await sc.rig.restart_nats()
        await reconnected(sc.rig)
        await rh.admitted_more(sc, churn, rh.ADMITTED_AFTER, rh.PROGRESS_SECONDS)
        assert all(sc.rig.alive(name) for name in SERVICES), sc.logs()
        await rh.settle(sc, churn)
