"""Wake-ups that carry no data: whoever wakes reads the state itself.

A change of the claims, of a Pod's state or of the hardware calls `touch()`. The recompute loop
waits on a coalescing flag (many touches while it works make one more pass, never a queue), and an
`Allocate` waiting for room waits for the next touch after the read it acted on.
"""

from __future__ import annotations

import asyncio


class Changes:
    def __init__(self) -> None:
        self._dirty = asyncio.Event()
        self._next = asyncio.Event()
        self.touches = 0  # how many changes were signalled
        self.passes = 0  # how many recompute passes they caused

    def touch(self) -> None:
        self.touches += 1
        self._dirty.set()
        fired, self._next = self._next, asyncio.Event()
        fired.set()

    async def pending(self) -> None:
        """Return once something changed since the last return (the recompute loop's wait)."""
        await self._dirty.wait()
        self._dirty.clear()
        self.passes += 1

    def next_change(self) -> asyncio.Event:
        """An event set by the next touch. Take it *before* reading, then wait on it."""
        return self._next
