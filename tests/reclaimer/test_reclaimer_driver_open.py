"""The reclaimer opens its driver off the event loop (docs/protocol.md: every driver call runs in a
worker thread): a vendor library that takes its time to load must not stall the loop, whose
NATS heartbeats and endpoints keep answering meanwhile."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from partkeeper import drivers
from partkeeper.config import Config
from partkeeper_sim.driver import SimDriver

OPEN_LIMIT_SECONDS = 10.0  # an open still blocked after this gives up: the loop was stalled


async def test_a_driver_whose_open_blocks_does_not_stall_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, start_reclaimer, sim_state: Path
) -> None:
    opening = threading.Event()
    released = threading.Event()

    def slow_open(config: Config) -> SimDriver:
        opening.set()
        # Only a loop that still runs can release this open; a loop blocked in it cannot.
        if not released.wait(OPEN_LIMIT_SECONDS):
            raise AssertionError("the driver's open blocked the event loop")
        return SimDriver(config.sim_state)

    monkeypatch.setattr(drivers, "open_driver", slow_open)
    starting = asyncio.create_task(start_reclaimer())
    try:
        await asyncio.to_thread(opening.wait, OPEN_LIMIT_SECONDS)
        assert opening.is_set(), "the reclaimer never opened its driver"
        await asyncio.sleep(0)  # the loop runs while the open is blocked
        assert not starting.done()
        released.set()
        await starting
    finally:
        released.set()
        if not starting.done():
            starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
