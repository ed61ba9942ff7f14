"""The supervisor of `partkeeper up`, with real child processes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from partkeeper_sim.stack.processes import ChildExited, StackError, Supervisor, describe_exit
from tests_support.stack import short_workdir, wait_no_survivors

DEADLINE = 30.0

# Starts a grandchild that ignores SIGTERM in its own process group, then reports both pids on the
# inherited fd once its own SIGTERM disposition is set (argv[1] = fd, argv[2] = "ignore" or not).
FAMILY = """
import os, signal, subprocess, sys, time
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
fd = int(sys.argv[1])
os.write(fd, f"{os.getpid()} {grandchild.pid}\\n".encode())
os.close(fd)
time.sleep(600)
"""


@pytest.fixture
def workdir() -> Iterator[Path]:
    with short_workdir() as path:
        yield path


async def start_family(supervisor: Supervisor, workdir: Path, name: str, mode: str) -> int:
    """Start a child with a grandchild; returns the grandchild's pid once both are set up."""
    read_fd, write_fd = os.pipe()
    try:
        await supervisor.start(name, [sys.executable, "-c", FAMILY, str(write_fd), mode],
                               log_path=workdir / f"{name}.log", env=os.environ, tier=1,
                               pass_fds=[write_fd])
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        line = await asyncio.wait_for(asyncio.to_thread(pipe.readline), DEADLINE)
    return int(line.split()[1])


async def test_stop_terminates_kills_the_stubborn_and_leaves_no_group_member(
    workdir: Path,
) -> None:
    supervisor = Supervisor(workdir / "pids.json", grace=1.0)
    try:
        await start_family(supervisor, workdir, "polite", "default")
        await start_family(supervisor, workdir, "stubborn", "ignore")
    finally:
        notes = await supervisor.stop()

    assert len(notes) == 1 and "stubborn" in notes[0] and "killed" in notes[0]
    statuses = {c.name: c.status for c in supervisor.children}
    assert statuses == {"polite": -15, "stubborn": -9}
    recorded = json.loads((workdir / "pids.json").read_text())["children"]
    assert {name: c["exit_status"] for name, c in recorded.items()} == statuses
    # Both grandchildren ignored SIGTERM; the group-wide SIGKILL ended them too.
    assert not wait_no_survivors([c.pid for c in supervisor.children])


async def test_a_child_that_dies_is_reported_with_its_log(workdir: Path) -> None:
    supervisor = Supervisor(workdir / "pids.json")
    try:
        script = "print('cannot open the thing'); raise SystemExit(3)"
        await supervisor.start("fragile", [sys.executable, "-c", script],
                               log_path=workdir / "fragile.log", env=os.environ, tier=1)
        child = await asyncio.wait_for(supervisor.died(), DEADLINE)
    finally:
        await supervisor.stop()
    message = describe_exit(child)
    assert "fragile" in message and "exited with status 3" in message
    assert str(workdir / "fragile.log") in message and "cannot open the thing" in message


async def test_guard_reports_a_death_during_a_wait(workdir: Path) -> None:
    supervisor = Supervisor(workdir / "pids.json")
    never = asyncio.Event()
    try:
        await supervisor.start("quitter", [sys.executable, "-c", "raise SystemExit(5)"],
                               log_path=workdir / "quitter.log", env=os.environ, tier=1)
        with pytest.raises(ChildExited, match="while waiting for the answer: quitter"):
            await supervisor.guard(never.wait(), timeout=DEADLINE, what="the answer",
                                   log=workdir / "quitter.log")
    finally:
        await supervisor.stop()


async def test_guard_names_what_expired_and_the_log(workdir: Path) -> None:
    supervisor = Supervisor(workdir / "pids.json")
    log = workdir / "slow.log"
    log.write_text("still loading\n")
    never = asyncio.Event()
    with pytest.raises(StackError, match="gave up waiting for the slow part after") as caught:
        await supervisor.guard(never.wait(), timeout=0.1, what="the slow part", log=log)
    assert str(log) in str(caught.value) and "still loading" in str(caught.value)
    await supervisor.stop()


async def test_guard_cancelled_cancels_its_work(workdir: Path) -> None:
    supervisor = Supervisor(workdir / "pids.json")
    started, ended = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()

    waiting = asyncio.create_task(
        supervisor.guard(work(), timeout=DEADLINE, what="work", log=workdir / "x.log")
    )
    await asyncio.wait_for(started.wait(), DEADLINE)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert ended.is_set()
    await supervisor.stop()
