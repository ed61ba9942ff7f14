"""Crashes nobody planned: `kill -9` of each service, and the nats-server restarted in place,
while Pods come and go. Nothing is lost (invariant 6), nothing leaks, nothing is destroyed under
a live Pod, and the node goes on admitting Pods after the restart."""

from __future__ import annotations

import time

import pytest
from reliability.rel_harness import CONVERGE_AFTER_CREATE_TIMEOUT, Scene, scene

from partkeeper.stack.churn import Churn
from partkeeper.stack.launch import SERVICES
from partkeeper.stack.rig import reconnected

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

CHURN_PROFILES = ("1g.10gb", "2g.20gb", None)
CYCLES_BEFORE = 4
ADMITTED_AFTER = 3
PROGRESS_SECONDS = 90.0
SIGKILL_STATUS = -9


async def admitted_more(sc: Scene, churn: Churn, more: int, timeout: float) -> None:
    """Churn goes on until `more` further Pods were admitted (the node works again)."""
    target = sc.work.tally.admitted + more
    end = time.monotonic() + timeout
    while sc.work.tally.admitted < target:
        remaining = end - time.monotonic()
        assert remaining > 0, (f"only {sc.work.tally.admitted - target + more} of {more} Pods "
                               f"admitted in {timeout:.0f}s after the restart; refusals "
                               f"{sc.work.tally.refusals[-5:]}\n{sc.logs()}")
        await churn.until_cycles(churn.cycles + 1, remaining)


async def churning(sc: Scene, seed: int) -> Churn:
    await sc.admit("3g.40gb", "keep")
    churn = sc.churn(CHURN_PROFILES, seed=seed)
    await churn.until_cycles(CYCLES_BEFORE, PROGRESS_SECONDS)
    return churn


async def settle(sc: Scene, churn: Churn) -> None:
    await churn.stop()
    await sc.check_converged(CONVERGE_AFTER_CREATE_TIMEOUT)  # a kill may leave a `creating`
    await sc.work.delete_all()
    await sc.check_converged()


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
