"""The runtime outlives a failing service body and ends only for a start-up error."""

from __future__ import annotations

import asyncio
import gc
import os
import selectors
import signal
import subprocess
import sys

import nats.errors
import pytest

from partkeeper import runtime
from partkeeper.errors import StartupError
from partkeeper.lifecycle import Lifecycle, TaskEnded


async def test_a_failing_body_is_started_again_until_stopped(monkeypatch) -> None:
    monkeypatch.setattr(runtime.backoff, "delay", lambda attempt, **_: 0.01)
    stop = asyncio.Event()
    starts = 0

    async def body() -> None:
        nonlocal starts
        starts += 1
        if starts <= 2:
            raise nats.errors.TimeoutError  # what a bus hiccup at start looks like
        stop.set()
        await asyncio.Event().wait()  # runs until cancelled

    async with asyncio.timeout(30):
        await runtime.supervise("gc", body, stop)
    assert starts == 3


async def test_what_a_service_built_until_ready_is_exempted_from_collection() -> None:
    # A full collection walks every object the process holds; the start's (modules, clients,
    # configuration) stay for the life of the process and are moved out of its reach once the
    # body says it is ready, and not before (partkeeper/heap.py).
    gc.unfreeze()
    ready = asyncio.Event()
    freezing = asyncio.create_task(runtime._freeze_when_ready("allocator", ready))
    try:
        built = ["the start's state"]
        await asyncio.sleep(0)
        assert gc.get_freeze_count() == 0, "frozen before the service was ready"
        ready.set()
        await asyncio.wait_for(freezing, 5)
        later = ["made while serving"]
        walked = {id(o) for o in gc.get_objects()}
        assert id(built) not in walked, "the start's objects are still walked by collections"
        assert id(later) in walked, "what the service makes afterwards is collected as usual"
    finally:
        freezing.cancel()
        gc.unfreeze()


async def test_a_start_up_error_ends_the_service() -> None:
    async def body() -> None:
        raise StartupError("PK_DRIVER=nvml but libnvidia-ml.so.1 does not load")

    with pytest.raises(StartupError, match="libnvidia-ml"):
        async with asyncio.timeout(30):
            await runtime.supervise("allocator", body, asyncio.Event())


async def test_lifecycle_surfaces_the_first_failure_and_stops_in_order() -> None:
    order: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append(f"task {name}")

    async def fails() -> None:
        raise ValueError("the first failure")

    with pytest.raises(ValueError, match="the first failure"):
        async with Lifecycle("t") as life:
            life.on_stop("closer a", lambda: order.append("closer a"))
            life.spawn("one", forever("one"))
            life.on_stop("closer b", lambda: order.append("closer b"))
            life.spawn("two", forever("two"))
            life.spawn("fails", fails())
            await life.run()
    assert order == ["task two", "task one", "closer b", "closer a"]


async def test_lifecycle_says_which_task_ended_by_itself() -> None:
    async def ends() -> None:
        return

    with pytest.raises(TaskEnded, match="t quits"):
        async with Lifecycle("t") as life:
            life.spawn("quits", ends())
            await life.run()


HUNG_AFTER_SIGTERM = """
import asyncio, threading, time
from partkeeper.lifecycle import stop_on_signals

def blocked_in_a_call_without_a_timeout() -> None:
    time.sleep(60)

async def main() -> None:
    stop = stop_on_signals(report_after=0.5)
    print("ready", flush=True)
    await stop.wait()
    await asyncio.to_thread(blocked_in_a_call_without_a_timeout)

asyncio.run(main())
"""


def test_a_stop_that_hangs_reports_every_threads_stack() -> None:
    proc = subprocess.Popen([sys.executable, "-c", HUNG_AFTER_SIGTERM], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        report = b""
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stderr, selectors.EVENT_READ)
            while b"blocked_in_a_call_without_a_timeout" not in report:
                assert selector.select(timeout=30.0), f"no stack report: {report!r}"
                chunk = os.read(proc.stderr.fileno(), 65536)
                assert chunk, f"stderr closed without the report: {report!r}"
                report += chunk
        assert b"Thread 0x" in report
    finally:
        proc.kill()
        proc.communicate(timeout=30)
