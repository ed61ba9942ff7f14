"""Crashes nobody planned: `kill -9` of each service, and the nats-server restarted in place,
while Pods come and go. Nothing is lost (invariant 6), nothing leaks, nothing is destroyed under
a live Pod, and the node goes on admitting Pods after the restart."""

from __future__ import annotations

import pytest
from reliability.rel_harness import (
    ADMITTED_AFTER,
    PROGRESS_SECONDS,
    admitted_more,
    churning,
    scene,
    settle,
)

from partkeeper.stack.launch import SERVICES
from tests_support.rig import reconnected

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

SIGKILL_STATUS = -9


@pytest.mark.parametrize("service", SERVICES)
async def test_kill_9_mid_churn(service: str) -> None:
    async with scene() as sc:
        churn = await churning(sc, seed=SERVICES.index(service))
        assert await sc.rig.kill(service) == SIGKILL_STATUS
        await sc.rig.restart(service)
        await admitted_more(sc, churn, ADMITTED_AFTER, PROGRESS_SECONDS)
        await settle(sc, churn)


async def test_nats_server_restarted_in_place_mid_churn() -> None:
    async with scene() as sc:
        churn = await churning(sc, seed=7)
        await sc.rig.restart_nats()
        await reconnected(sc.rig)
        await admitted_more(sc, churn, ADMITTED_AFTER, PROGRESS_SECONDS)
        assert all(sc.rig.alive(name) for name in SERVICES), sc.logs()
        await settle(sc, churn)
