"""Stopping a set of tasks for certain.

On Python 3.11 `asyncio.wait_for` (used inside nats-py for every request) returns the result and
drops a cancellation that arrives just as the awaited reply does, so one `cancel()` can leave a
loop running for ever. Cancelling again until the tasks are done makes shutdown deterministic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

RECANCEL_SECONDS = 0.5


async def cancel_all(tasks: Iterable[asyncio.Task[object]]) -> None:
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
