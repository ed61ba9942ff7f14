"""An Allocate that cannot reach the claims store waits for it, bounded, then fails closed.

During a JetStream election (one server of three down, a quorum left) or a single server's
restart of a few seconds, reads and CAS writes of the claims time out or answer "JetStream system
temporarily unavailable". Refusing the Allocate then fails a Pod for a bus hiccup (for good, with
`restartPolicy: Never`). So the Allocate's store calls go through `waiting`: a call that fails
because the store is unreachable is tried again with backoff until `Options.room_wait_seconds`
(the same budget as the wait for room) has passed; then the last error is raised and the caller
refuses as before. Anything else (a conflict, an undecodable document, a driver error) is raised
at once. Cancellation (kubelet gave up) ends the wait at once: no catch of CancelledError here.

The Pod lookups of an Allocate (`pods.get`) wait the same way for a watcher that gives no usable
answer (`answered`): during an election the watcher cannot persist what its fresh LIST saw and
answers with an error. An Allocate passes its one deadline (`until`) to every such wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

from partkeeper import backoff
from partkeeper.bus import RemoteError, Unanswered
from partkeeper.bus.rpc import BAD_REQUEST
from services.allocator.core.context import Context

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


def unanswered(exc: BaseException) -> bool:
    """No usable answer from a peer service, except a refusal of the request itself."""
    if isinstance(exc, RemoteError):
        return exc.code != str(BAD_REQUEST)
    return isinstance(exc, Unanswered)


def deadline(ctx: Context) -> float:
    return asyncio.get_running_loop().time() + ctx.options.room_wait_seconds


async def waiting(
    ctx: Context, what: str, call: Callable[[], Awaitable[T]], until: float | None = None
) -> T:
    """`await call()`, again while the store is unreachable, until `until` (loop time; the
    allocation's deadline) or, without one, for at most the room budget from now."""
    return await _again(deadline(ctx) if until is None else until, what,
                        "the claims store is unreachable", unreachable, call)


async def answered(until: float, what: str, call: Callable[[], Awaitable[T]]) -> T:
    """`await call()`, again while the peer gives no usable answer, until `until` (loop time)."""
    return await _again(until, what, "no usable answer", unanswered, call)


async def _again(
    until: float, what: str, trouble: str, transient: Callable[[BaseException], bool],
    call: Callable[[], Awaitable[T]],
) -> T:
    return await backoff.retry(
        f"{what}: {trouble}", call, transient=transient, schedule=backoff.Schedule(0.1, 2.0),
        deadline=until, doing="asked again before the Allocate is refused",
    )
