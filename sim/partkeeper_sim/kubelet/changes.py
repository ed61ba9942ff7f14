"""A wake-up for "something changed": waiters re-read state themselves (it carries no data)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Changes:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.count = 0

    def touch(self) -> None:
        self.count += 1
        self._event.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Return once `predicate()` holds; TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while not predicate():
                self._event.clear()
                await self._event.wait()

    async def since(self, count: int) -> None:
        """Return once a touch came after the one that made `count`: read `count` first, then
        the state, then wait here, and a change during the read is not lost. (Counted, not a
        cleared event: another waiter clearing the shared event must not hide a touch.)"""
        while self.count == count:
            self._event.clear()
            await self._event.wait()
