"""Small builders shared by tests."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TextIO

from schemas import Claim, LiveInstance
from schemas.events import ClaimState

UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


def make_claim(
    cid: str, start: int, size: int, *, card: int = 0, state: ClaimState = "creating",
    uid: str = UID,
) -> Claim:
    return Claim(
        id=cid, state=state, pod_uid=uid, namespace="default", name="pod", container="main",
        resource="nvidia.com/mig-test", device_ids=[cid], card=card, profile="test",
        start=start, size=size, created_at=0, updated_at=0,
    )


def instance_of(claim: Claim) -> LiveInstance:
    """The instance `claim` holds, failing the test when it holds none (still creating, or a
    slice)."""
    if claim.instance is None:
        raise AssertionError(f"claim {claim.id} ({claim.state}) holds no instance")
    return claim.instance


DEADLINE = 20.0  # a bound on waiting, never an expectation of how long anything takes


async def until(
    check: Callable[[], Awaitable[object] | object],
    what: str,
    timeout: float = DEADLINE,
) -> None:
    """Wait until `check()` (sync or async) is truthy, failing with `what` after `timeout`
    seconds: a deadline, never an expectation of how long anything takes. The one wait of the
    tests; a failed one prints where every other task of the loop is waiting."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            show_waiting_tasks()
            raise AssertionError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(0.01)


def show_waiting_tasks(prefixes: tuple[str, ...] = ("",), file: TextIO | None = None) -> None:
    """Print, for every other task whose name starts with one of `prefixes`, the whole chain of
    awaits it is suspended in (Task.print_stack shows only a suspended coroutine's outer frame,
    which does not tell a stuck call from an idle loop)."""
    out = file or sys.stderr
    current = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is current or not task.get_name().startswith(prefixes):
            continue
        print(f"--- {task.get_name()}", file=out)
        for where in _await_chain(task.get_coro()):
            print(f"    {where}", file=out)


def _await_chain(coro: object) -> list[str]:
    chain = []
    while coro is not None:
        frame = (getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                 or getattr(coro, "ag_frame", None))
        if frame is None:  # a future, or a coroutine of compiled code
            chain.append(repr(coro)[:200])
            break
        chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = (getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
                or getattr(coro, "ag_await", None))
    return chain


@contextlib.contextmanager
def short_tmpdir(prefix: str = "pk") -> Iterator[Path]:
    """A temp dir under /tmp short enough for unix socket paths (about 107 bytes at most),
    removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
