"""How a service's tasks start, run and stop: the one lifecycle every service uses.

`Lifecycle` starts named tasks, waits until one of them ends (a task of a service runs until it is
cancelled, so one that ends has failed: its error is raised, the first one only), then stops
everything in order: tasks in the reverse order of their start, then the closers registered with
`on_stop`, last registered first.

Cancellation is honoured for certain. On Python 3.11 `asyncio.wait_for` (used inside nats-py for
every request) returns the result and drops a cancellation that arrives just as the awaited reply
does, so one `cancel()` can leave a loop running for ever: `cancel_all` cancels again until the
tasks are done, and loops call `honour_cancel()` after a NATS call. Service code waits with
`woken_or_timeout` (built on `asyncio.timeout`, which does not have that race), never
`asyncio.wait_for`.

A process stops on SIGTERM or SIGINT through `stop_on_signals`. A stop that has not finished
`SHUTDOWN_REPORT_SECONDS` later prints every thread's stack to stderr (`faulthandler`), so a
process that hangs on its way out (a thread blocked in a call without a timeout, a task that
outlives its cancel) says where before the kubelet's SIGKILL, which comes 30 s after SIGTERM by
default (`terminationGracePeriodSeconds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

log = logging.getLogger(__name__)

RECANCEL_SECONDS = 0.5
SHUTDOWN_REPORT_SECONDS = 20.0

Closer = Callable[[], Awaitable[object] | object]


class TaskEnded(RuntimeError):
    """A service task returned although it should run until cancelled."""


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)


def honour_cancel() -> None:
    """Raise CancelledError if this task was asked to stop (a cancel a library swallowed is
    still counted by `Task.cancelling()`)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def stop_on_signals(report_after: float = SHUTDOWN_REPORT_SECONDS) -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, which also arms the stack report (module docstring).
    Call it from the running loop, before anything waits on the event."""
    stop = asyncio.Event()

    def stopping() -> None:
        if not stop.is_set():
            faulthandler.dump_traceback_later(report_after, exit=False)
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping)
    return stop


async def woken_or_timeout(event: asyncio.Event, seconds: float) -> bool:
    """Wait for `event` at most `seconds`; True if it was set. Cancellation always propagates."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, seconds)):
            await event.wait()
    return event.is_set()


class Lifecycle:
    """`async with Lifecycle("gc") as life: life.spawn(...); await life.run()`."""

    def __init__(self, service: str) -> None:
        self.service = service
        self._tasks: list[asyncio.Task[Any]] = []
        self._closers: list[tuple[str, Closer]] = []
        self._ended = asyncio.Event()

    def spawn(self, name: str, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(work, name=f"{self.service} {name}")
        task.add_done_callback(lambda _t: self._ended.set())
        self._tasks.append(task)
        return task

    def on_stop(self, what: str, closer: Closer) -> None:
        """Run `closer` at the stop, after every task has ended (last registered, first run)."""
        self._closers.append((what, closer))

    async def run(self) -> None:
        """Until cancelled or a task ends; raises that task's error (or TaskEnded)."""
        await self.until(asyncio.Event())

    async def until(self, event: asyncio.Event) -> None:
        """Wait for `event` (a start-up step of a task), raising at once if a task ends first."""
        waiting = asyncio.ensure_future(event.wait())
        try:
            while not event.is_set():
                ended = asyncio.ensure_future(self._ended.wait())
                await asyncio.wait({waiting, ended}, return_when=asyncio.FIRST_COMPLETED)
                await cancel_all([ended])
                self._ended.clear()
                for task in self._tasks:
                    if task.done():
                        _raise_for(task)
        finally:
            await cancel_all([waiting])

    async def __aenter__(self) -> Lifecycle:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for task in reversed(self._tasks):
            await cancel_all([task])
        for what, closer in reversed(self._closers):
            try:
                result = closer()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # a failing closer must not keep the others from running
                log.warning("%s: stopping %s failed: %s", self.service, what, exc)


def _raise_for(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        raise TaskEnded(f"task {task.get_name()} was cancelled by someone else")
    error = task.exception()
    if error is not None:
        raise error
    raise TaskEnded(f"task {task.get_name()} ended by itself")
