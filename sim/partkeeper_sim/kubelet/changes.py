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

    def armed(self) -> asyncio.Event:
        """The event the next touch sets, cleared now: clear, read the state, then wait on it,
        so a change during the read is not lost."""
        self._event.clear()
        return self._event
