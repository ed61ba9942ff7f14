"""The card-health watcher over the simulated driver: events in, changes out, metrics counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from partkeeper.cardwatch import CardWatch
from partkeeper.drivers.base import InstanceSpec
from partkeeper.drivers.cardhealth import CardEvent, CardHealth, Fault, Scope, policy
from partkeeper_sim.driver import SimDriver, init_state
from tests_support import until


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_changes_reach_the_owner_and_the_metrics(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    init_state(state, ["H100-80GB", "H100-80GB"], [], seed="cardwatch")
    driver = SimDriver(state)
    made = driver.create(InstanceSpec(0, "1g.10gb", 0))
    told: list[tuple[Fault, CardHealth]] = []

    async def on_change(health: CardHealth, fault: Fault, _event: CardEvent) -> None:
        told.append((fault, health))

    watch = CardWatch(driver.events, policy(), on_change)
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0)
    events_before = metric("partkeeper_card_events_total", card="1", cause="xid-13")
    try:
        await asyncio.to_thread(driver.fail_card, 1, 13)  # an application's: nothing fails
        await until(lambda: metric("partkeeper_card_events_total", card="1", cause="xid-13")
                    > events_before, "the XID 13 counted")
        assert told == []

        await asyncio.to_thread(driver.fail_card, 0, 94, made.uuid)
        await until(lambda: len(told) == 1, "the instance fault")
        assert told[0][0].scope is Scope.INSTANCE
        assert watch.health.failed_cards() == frozenset()

        await asyncio.to_thread(driver.fail_card, 1, 79)
        await until(lambda: len(told) == 2, "the lost card")
        assert told[1][0].cause == "lost"
        assert watch.health.failed_cards() == {1}
        assert metric("partkeeper_card_failed_devices", card="1", cause="lost") == 1

        await asyncio.to_thread(driver.fail_card, 1, 48)  # already failed: no second change
        await asyncio.to_thread(driver.recover_card, 1)
        await until(lambda: len(told) == 3, "the recovery")
        assert told[2][0].scope is Scope.RECOVERED
        assert watch.health.failed_cards() == frozenset()
        assert metric("partkeeper_card_failed_devices", card="1", cause="lost") == 0
        # Nothing was destroyed by any of it.
        assert [i.uuid for i in driver.instances(0)] == [made.uuid]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_driver_without_events_is_not_watched() -> None:
    async def on_change(*_: object) -> None:
        raise AssertionError("no change without events")

    watch = CardWatch(lambda: None, policy(), on_change)
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0.05)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
