"""An Allocate that cannot reach the claims store waits for it, bounded, then fails closed.

During a JetStream election (one server of three down, a quorum left) or a single server's
restart of a few seconds, reads and CAS writes of the claims time out or answer "JetStream system
temporarily unavailable". Refusing the Allocate then fails a Pod for a bus hiccup (for good, with
`restartPolicy: Never`). So the Allocate's store calls go through `waiting`: a call that fails
because the store is unreachable is tried again with backoff until `Options.room_wait_seconds`
(the same budget as the wait for room) has passed; then the last error is raised and the caller
refuses as before. Anything else (a conflict, an undecodable document, a driver error) is raised
at once. Cancellation (kubelet gave up) ends the wait at once: no catch of CancelledError here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

from partkeeper.bus import backoff
from services.allocator.context import Context

log = logging.getLogger(__name__)
T = TypeVar("T")

UNAVAILABLE_CODES = frozenset({408, 503})


def unreachable(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, says the store could not be reached."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, nats.js.errors.APIError):
            if seen.code in UNAVAILABLE_CODES:
                return True
        elif isinstance(seen, TimeoutError | nats.errors.Error):
            return True
        seen = seen.__cause__
    return False


async def waiting(ctx: Context, what: str, call: Callable[[], Awaitable[T]]) -> T:
    """`await call()`, again while the store is unreachable, for at most the room budget."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.options.room_wait_seconds
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            attempt += 1
            left = deadline - loop.time()
            if not unreachable(exc) or left <= 0:
                raise
            wait = min(left, backoff.delay(attempt, base=0.1, cap=2.0))
            log.warning("%s: the claims store is unreachable (%s); again in %.1fs, %.0fs left "
                        "before the Allocate is refused", what, exc, wait, left)
            await asyncio.sleep(wait)
