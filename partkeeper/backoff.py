"""The one retry schedule of the project and the two loops built on it.

- `delay(attempt)`: bounded exponential backoff with jitter, the wait before retry `attempt`.
- `retry(what, call, ...)`: "try this until it works, the deadline passes, the attempts run out
  or we are cancelled". A failure the caller's `transient` accepts (or an `Again` the call
  returns) is logged with what happens next and tried again after the schedule's wait; anything
  else, and the last failure once the bound is reached, goes back to the caller as the caller's
  own error (an `Again` as `GaveUp`), so the boundary decides what it answers.
- `every(what, period, work, ...)`: "run this every period, or sooner when woken" (kopf's
  `sleep(delays, wakeup)`: an `asyncio.Event` ends the wait early, nothing polls). A failed pass
  waits the schedule's delay instead of the period, and the next good pass resets it.
- `keep_following(what, follow)`: a watch or subscription loop started again whenever it ends.

Each loop counts its consecutive failures in a `Failures`, the only place a wait is computed
from the schedule and logged. Cancellation always propagates (no catch of CancelledError), and
the waits are `asyncio.sleep` or `lifecycle.woken_or_timeout`, never `asyncio.wait_for`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from partkeeper.lifecycle import woken_or_timeout

log = logging.getLogger(__name__)
T = TypeVar("T")

Sleep = Callable[[float], Awaitable[object]]
Clock = Callable[[], float]
Wakeup = asyncio.Event | Callable[[], asyncio.Event]


def delay(attempt: int, *, base: float = 0.2, cap: float = 30.0) -> float:
    """Seconds before retry `attempt` (1-based): uniform in [c/2, c], c = min(cap, base*2^n)."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return random.uniform(ceiling / 2, ceiling)


@dataclass(frozen=True, slots=True)
class Schedule:
    """`delay` with a loop's own base and cap: `schedule(attempt)` is the wait before a retry."""

    base: float = 0.2
    cap: float = 30.0

    def __call__(self, attempt: int) -> float:
        return delay(attempt, base=self.base, cap=self.cap)


DEFAULT = Schedule()


@dataclass(frozen=True, slots=True)
class Again:
    """What a call returns for "not yet" without an exception: `problem` says what it saw.
    `until` (loop time) lets the retry go on past its attempts while that time has not come."""

    problem: str
    until: float | None = None


class GaveUp(Exception):
    """The bound of a `retry` was reached on an `Again`: what was tried, seen, and how often."""

    def __init__(self, what: str, problem: str, attempts: int) -> None:
        super().__init__(f"{what}: {problem}, after {attempts} attempts")
        self.what, self.problem, self.attempts = what, problem, attempts


def always(_exc: Exception) -> bool:
    return True


def never(_exc: Exception) -> bool:
    """For a call whose "not yet" is an `Again` and whose every exception is the caller's."""
    return False


@dataclass(slots=True)
class Failures:
    """The consecutive failures of one loop, and the wait each one earns from `schedule`."""

    what: str
    schedule: Callable[[int], float] = DEFAULT
    count: int = 0
    level: int = logging.WARNING  # lower for a retry that is routine (a lost compare-and-set)

    def failed(
        self, problem: object, doing: str = "again", *, left: float | None = None,
        trace: bool = False,
    ) -> float:
        """Count a failure, log it with what happens next, and return the seconds to wait (never
        more than `left`, the seconds to a deadline). `trace` logs an exception's traceback
        too (a loop that catches everything)."""
        self.count += 1
        wait = self.schedule(self.count)
        if left is not None:
            wait = min(wait, max(0.0, left))
            doing = f"{doing} ({left:.0f}s left)"
        log.log(self.level, "%s: %s; %s in %.1fs (failure %d)", self.what, _said(problem), doing,
                wait, self.count, extra={"retry": self.count},
                exc_info=problem if trace and isinstance(problem, BaseException) else None)
        return wait

    def succeeded(self) -> None:
        if self.count:
            log.info("%s: working again after %d failures", self.what, self.count)
        self.count = 0


async def retry(
    what: str,
    call: Callable[[], Awaitable[T | Again]],
    *,
    transient: Callable[[Exception], bool] = always,
    schedule: Callable[[int], float] = DEFAULT,
    attempts: int | None = None,
    deadline: float | None = None,
    doing: str = "again",
    level: int = logging.WARNING,
    sleep: Sleep = asyncio.sleep,
    clock: Clock | None = None,
) -> T:
    """`await call()` until it returns a value, retrying transient failures (module docstring).

    `attempts` bounds the calls, `deadline` (loop time, or `clock`'s) the time: a wait never
    goes past it, and a failure once it has come is the last. With neither, it tries until it
    works or is cancelled. A failure that is not `transient` is raised at once; the last one is
    raised unchanged (an `Again` as `GaveUp`). `level` is the failures' log level.
    """
    now = clock or asyncio.get_running_loop().time
    failures = Failures(what, schedule, level=level)
    while True:
        try:
            result = await call()
        except Exception as exc:
            if not transient(exc) or _bound_reached(failures.count + 1, attempts, deadline, now):
                raise
            problem: object = exc
        else:
            if not isinstance(result, Again):
                return result
            if _bound_reached(failures.count + 1, attempts, deadline, now, result.until):
                raise GaveUp(what, result.problem, failures.count + 1)
            problem = result.problem
        left = None if deadline is None else deadline - now()
        await sleep(failures.failed(problem, doing, left=left))


def _bound_reached(
    made: int, attempts: int | None, deadline: float | None, now: Clock, until: float | None = None
) -> bool:
    if deadline is not None and now() >= deadline:
        return True
    if attempts is None or made < attempts:
        return False
    return until is None or now() >= until


async def every(
    what: str,
    period: float | None,
    work: Callable[[], Awaitable[object]],
    *,
    wakeup: Wakeup | None = None,
    schedule: Callable[[int], float] = DEFAULT,
    transient: Callable[[Exception], bool] = always,
    sleep: Sleep = asyncio.sleep,
) -> NoReturn:
    """Run `work` now and then every `period` seconds until cancelled (module docstring).

    `wakeup` ends a wait early: an Event (cleared before each pass, so a set during the pass runs
    another) or a function returning the event of the next change (called before each pass, as
    `Changes.next_change`). `period` None waits for the wake-up only. A pass fails by raising a
    `transient` error or returning an `Again`; a failure that is not transient ends the loop.
    """
    if period is None and wakeup is None:
        raise ValueError(f"{what}: a loop without a period needs a wake-up")
    failures = Failures(what, schedule)
    while True:
        woken = _next_wakeup(wakeup)
        wait = await _pass(work, failures, transient, period)
        if woken is None:
            await sleep(wait if wait is not None else 0.0)
        elif wait is None:
            await woken.wait()
        else:
            await woken_or_timeout(woken, wait)


async def _pass(
    work: Callable[[], Awaitable[object]], failures: Failures,
    transient: Callable[[Exception], bool], period: float | None,
) -> float | None:
    """One pass of `every`: the seconds to wait before the next (None: until woken)."""
    try:
        outcome = await work()
    except Exception as exc:
        if not transient(exc):
            raise
        return failures.failed(exc, trace=transient is always)
    if isinstance(outcome, Again):
        return failures.failed(outcome.problem)
    failures.succeeded()
    return period


def _next_wakeup(wakeup: Wakeup | None) -> asyncio.Event | None:
    if wakeup is None:
        return None
    if isinstance(wakeup, asyncio.Event):
        wakeup.clear()
        return wakeup
    return wakeup()


async def keep_following(
    what: str,
    follow: Callable[[], Awaitable[None]],
    *,
    cap: float = 5.0,
    healthy: float = 60.0,
    after_gap: Callable[[], None] | None = None,
    sleep: Sleep = asyncio.sleep,
    clock: Clock | None = None,
) -> NoReturn:
    """Run `follow` (a watch or subscription loop) until cancelled, starting it again with
    backoff whenever it ends or fails; `after_gap` runs after each restart's wait (for example to
    wake a recompute, since changes may have been missed meanwhile). A follower that ran for
    `healthy` seconds before it ended starts the count afresh: a watch lost once a day is
    restarted after the schedule's first wait, not its cap."""
    now = clock or asyncio.get_running_loop().time
    failures = Failures(what, Schedule(cap=cap))
    while True:
        started = now()
        try:
            await follow()
            problem: object = "it ended"
        except Exception as exc:
            problem = exc
        if now() - started >= healthy:
            failures.succeeded()
        await sleep(failures.failed(problem))
        if after_gap is not None:
            after_gap()


def _said(problem: object) -> str:
    """An error as a log line shows it: its message, or its type where it has none."""
    if isinstance(problem, BaseException):
        said = str(problem)
        return f"{type(problem).__name__}: {said}" if said else type(problem).__name__
    return str(problem)
