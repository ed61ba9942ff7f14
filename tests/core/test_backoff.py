"""The kit's one retry and one periodic loop (partkeeper.backoff), driven by an injected sleep and
clock or by events: what is tried, how often, what is waited, what is raised. No timings."""

from __future__ import annotations

import asyncio
import logging

import pytest

from partkeeper import backoff


class Transient(Exception):
    pass


class Fatal(Exception):
    pass


class Clock:
    """A loop time that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def failing(*outcomes: object):
    """A call that raises or returns each of `outcomes` in turn, then returns "done"."""
    left = list(outcomes)
    calls: list[int] = []

    async def call() -> object:
        calls.append(1)
        if not left:
            return "done"
        outcome = left.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return call, calls


def counting(n: int) -> float:
    return float(n)


async def test_transient_failures_are_tried_again_on_the_schedule() -> None:
    clock = Clock()
    call, calls = failing(Transient("a"), Transient("b"))
    assert await backoff.retry("reading", call, schedule=counting, sleep=clock.sleep,
                               clock=clock) == "done"
    assert len(calls) == 3
    assert clock.waits == [1.0, 2.0]


async def test_a_failure_that_is_not_transient_is_raised_at_once() -> None:
    clock = Clock()
    call, calls = failing(Fatal("no"))
    with pytest.raises(Fatal):
        await backoff.retry("reading", call, transient=lambda e: isinstance(e, Transient),
                            sleep=clock.sleep, clock=clock)
    assert len(calls) == 1
    assert clock.waits == []


async def test_the_attempts_bound_raises_the_last_error_unchanged() -> None:
    clock = Clock()
    call, calls = failing(Transient("1"), Transient("2"), Transient("3"), Transient("4"))
    with pytest.raises(Transient, match="3"):
        await backoff.retry("reading", call, attempts=3, schedule=counting, sleep=clock.sleep,
                            clock=clock)
    assert len(calls) == 3
    assert clock.waits == [1.0, 2.0]


async def test_an_again_value_is_retried_and_gives_up_naming_what_was_seen() -> None:
    clock = Clock()
    call, calls = failing(backoff.Again("nobody yet"), backoff.Again("still nobody"))
    with pytest.raises(backoff.GaveUp) as raised:
        await backoff.retry("finding the Pod", call, attempts=2, sleep=clock.sleep, clock=clock)
    assert raised.value.problem == "still nobody"
    assert raised.value.attempts == 2
    assert "finding the Pod: still nobody, after 2 attempts" in str(raised.value)
    assert len(calls) == 2


async def test_an_again_with_until_goes_on_past_the_attempts_until_that_time() -> None:
    clock = Clock()
    call, calls = failing(*(backoff.Again("two candidates", until=5.0) for _ in range(10)))
    with pytest.raises(backoff.GaveUp):
        await backoff.retry("choosing", call, attempts=2, schedule=lambda _n: 1.0,
                            sleep=clock.sleep, clock=clock)
    assert len(calls) == 6  # at t = 0 .. 5, the last one at the time `until` names
    assert clock.now == 5.0


async def test_no_wait_goes_past_the_deadline_and_the_failure_at_it_is_raised() -> None:
    clock = Clock()
    call, calls = failing(*(Transient(str(n)) for n in range(10)))
    with pytest.raises(Transient, match="2"):
        await backoff.retry("reading", call, deadline=2.5, schedule=lambda _n: 2.0,
                            sleep=clock.sleep, clock=clock)
    assert clock.waits == [2.0, 0.5]
    assert len(calls) == 3


async def test_each_failure_is_logged_with_what_happens_next(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="partkeeper.backoff")
    clock = Clock()
    call, _ = failing(Transient("store unreachable"))
    await backoff.retry("reading the claims", call, doing="asked again", deadline=30.0,
                        schedule=lambda _n: 1.0, sleep=clock.sleep, clock=clock)
    [line] = [r.getMessage() for r in caplog.records]
    assert "reading the claims: Transient: store unreachable; asked again (30s left) in 1.0s" \
        in line


async def test_a_retry_cancelled_while_it_waits_stops() -> None:
    waiting = asyncio.Event()

    async def sleep(_seconds: float) -> None:
        waiting.set()
        await asyncio.Event().wait()

    call, calls = failing(*(Transient("x") for _ in range(10)))
    task = asyncio.create_task(backoff.retry("reading", call, sleep=sleep))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) == 1


class Stop(BaseException):
    """Ends a loop from its injected sleep, after the waits a test wants to see."""


def stopping_after(n: int, waits: list[float]):
    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) >= n:
            raise Stop

    return sleep


async def test_every_waits_the_period_after_a_pass_and_the_schedule_after_a_failure() -> None:
    waits: list[float] = []
    work, calls = failing(None, Transient("a"), backoff.Again("b"), None, None)
    with pytest.raises(Stop):
        await backoff.every("sweeping", 60.0, work, schedule=counting,
                            sleep=stopping_after(5, waits))
    assert waits == [60.0, 1.0, 2.0, 60.0, 60.0]  # a good pass resets the failures
    assert len(calls) == 5


async def test_every_ends_on_a_failure_that_is_not_transient() -> None:
    waits: list[float] = []
    work, calls = failing(None, Fatal("bug"))
    with pytest.raises(Fatal):
        await backoff.every("sweeping", 1.0, work, transient=lambda e: isinstance(e, Transient),
                            sleep=stopping_after(10, waits))
    assert len(calls) == 2


async def test_every_without_a_period_runs_only_when_woken() -> None:
    wake = asyncio.Event()
    ran = asyncio.Queue[int]()
    passes = 0

    async def work() -> None:
        nonlocal passes
        passes += 1
        ran.put_nowait(passes)

    task = asyncio.create_task(backoff.every("publishing", None, work, wakeup=wake))
    try:
        assert await ran.get() == 1
        for _ in range(20):  # the loop gets every chance to run without a wake-up
            await asyncio.sleep(0)
        assert ran.empty()
        wake.set()
        assert await ran.get() == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_wakeup_during_a_pass_makes_one_more_pass() -> None:
    wake = asyncio.Event()
    ran = asyncio.Queue[int]()
    passes = 0

    async def work() -> None:
        nonlocal passes
        passes += 1
        if passes == 1:
            wake.set()  # a change while the first pass reads: it must not be lost
        ran.put_nowait(passes)

    task = asyncio.create_task(backoff.every("publishing", 3600.0, work, wakeup=wake))
    try:
        assert [await ran.get(), await ran.get()] == [1, 2]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_wakeup_function_is_asked_for_the_next_change_before_each_pass() -> None:
    events: list[asyncio.Event] = []
    ran = asyncio.Queue[int]()

    def next_change() -> asyncio.Event:
        events.append(asyncio.Event())
        return events[-1]

    async def work() -> None:
        ran.put_nowait(len(events))

    task = asyncio.create_task(backoff.every("publishing", None, work, wakeup=next_change))
    try:
        assert await ran.get() == 1
        events[0].set()
        assert await ran.get() == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_every_refuses_a_loop_that_could_never_wake() -> None:
    async def work() -> None:
        raise AssertionError("never run")

    with pytest.raises(ValueError, match="needs a wake-up"):
        await backoff.every("publishing", None, work)


async def test_keep_following_starts_a_follower_again_after_it_ends_or_fails() -> None:
    waits: list[float] = []
    gaps: list[int] = []
    follow, calls = failing(Transient("connection lost"))
    with pytest.raises(Stop):
        await backoff.keep_following("watching pk-pods", follow, after_gap=lambda: gaps.append(1),
                                     sleep=stopping_after(3, waits))
    assert len(calls) == 3  # failed, ended, ended
    assert len(gaps) == 2


async def test_keep_following_counts_afresh_after_a_follower_that_ran_well() -> None:
    """Three quick failures climb the schedule (0.1-0.2, 0.2-0.4, 0.4-0.8 s); a follower that
    then ran for an hour is restarted after the schedule's first wait again, not a longer one."""
    clock = Clock()
    runs = iter([0.0, 0.0, 0.0, 3600.0])

    async def follow() -> None:
        clock.now += next(runs)
        raise Transient("connection lost")

    async def sleep(seconds: float) -> None:
        await clock.sleep(seconds)
        if len(clock.waits) == 4:
            raise Stop

    with pytest.raises(Stop):
        await backoff.keep_following("watching pk-claims", follow, sleep=sleep, clock=clock)
    assert clock.waits[2] >= 0.4
    assert clock.waits[3] <= 0.2


@pytest.mark.parametrize("attempt", [1, 2, 5, 40])
def test_the_schedule_is_bounded_and_jittered_below_its_ceiling(attempt: int) -> None:
    ceiling = min(3.0, 0.5 * 2 ** (attempt - 1))
    for _ in range(50):
        assert ceiling / 2 <= backoff.Schedule(0.5, 3.0)(attempt) <= ceiling


async def test_a_routine_retry_logs_at_its_own_level(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="partkeeper.backoff")
    clock = Clock()
    call, _ = failing(backoff.Again("another writer moved the revision on"))
    await backoff.retry("writing the claims of card 0", call, transient=backoff.never,
                        level=logging.DEBUG, sleep=clock.sleep, clock=clock)
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
