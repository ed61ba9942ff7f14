"""The supervisor of `partkeeper up`: starts child processes, notices one dying, stops them all.

asyncio subprocesses, because every wait of `up` (NATS answers, the cluster's readiness line, a
child's exit) is then one `await` that can be raced against "a child died" and a deadline.

- Each child runs in its own process group (`process_group=0`): a terminal's Ctrl-C reaches only
  `up`, which then stops the children in order instead of all of them at once, and anything a
  child spawns is stopped with it (signals go to the group).
- Its stdout and stderr are appended to `logs/<name>.log`.
- Stopping goes by tier, highest first (services, then the cluster, then NATS, so nothing loses
  its peer mid-shutdown): SIGTERM to the group, SIGKILL after a grace period, and a final SIGKILL
  to the group for stragglers once the leader is reaped. `up` always reaps its children, so none
  is left behind when it returns.
- Every child's pid is recorded in `pids.json` with its exit status once known, so a later look
  (a test, a person) can check that nothing survived.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from partkeeper_sim.stack.layout import write_json

T = TypeVar("T")
DEFAULT_GRACE = 10.0
TAIL_LINES = 15


class StackError(Exception):
    """Something of the stack failed; the message says what and which log to read."""


class ChildExited(StackError):
    """A child process ended while it was meant to run."""


@dataclass(slots=True)
class Child:
    name: str
    tier: int
    log_path: Path
    proc: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    @property
    def status(self) -> int | None:
        return self.proc.returncode


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of a log, indented, for an error message."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return f"    (cannot read {path}: {exc.strerror})"
    return "\n".join(f"    {line}" for line in text) or "    (empty)"


def describe_exit(child: Child) -> str:
    status = child.status
    how = f"was killed by signal {-status}" if status is not None and status < 0 else \
        f"exited with status {status}"
    return (f"{child.name} (pid {child.pid}) {how}; its log is {child.log_path}, ending:\n"
            f"{tail(child.log_path)}")


class Supervisor:
    def __init__(self, pids_file: Path, *, grace: float = DEFAULT_GRACE) -> None:
        self._pids_file = pids_file
        self._grace = grace
        self._children: list[Child] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self._released: set[int] = set()  # pids whose end is expected (killed or restarted)
        self.notes: list[str] = []
        self._died: asyncio.Future[Child] | None = None

    @property
    def children(self) -> tuple[Child, ...]:
        return tuple(self._children)

    @property
    def released(self) -> frozenset[int]:
        return frozenset(self._released)

    def _death(self) -> asyncio.Future[Child]:
        if self._died is None:
            self._died = asyncio.get_running_loop().create_future()
        return self._died

    async def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str],
        tier: int,
        pass_fds: Sequence[int] = (),
    ) -> Child:
        with _open_log(log_path, argv) as log:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=dict(env), process_group=0, pass_fds=tuple(pass_fds),
            )
        child = Child(name, tier, log_path, proc)
        self._children.append(child)
        self._death()
        self._watchers.append(asyncio.create_task(self._watch(child), name=f"watch {name}"))
        self._record()
        return child

    async def _watch(self, child: Child) -> None:
        await child.proc.wait()
        self._record()
        died = self._death()
        if not self._stopping and child.pid not in self._released and not died.done():
            died.set_result(child)

    def release(self, child: Child) -> None:
        """From now on `child` may end without that counting as a death of the stack.

        For a test or a soak that kills a service on purpose, expects a fault point to end it, or
        restarts one that died (as Kubernetes would), and then starts it again with `start`.
        """
        self._released.add(child.pid)
        died = self._died
        if died is not None and died.done() and died.result() is child:
            self._died = None  # its death was taken in hand: the stack is whole again

    async def kill(self, child: Child, signum: int = signal.SIGKILL) -> int:
        """Signal `child`'s group (released first) and return its exit status once reaped.

        A child still running `grace` seconds after another signal than SIGKILL is killed, and
        the note saying so is kept in `notes` (a service that ignores SIGTERM is worth a look).
        """
        self.release(child)
        _signal_group(child.pid, signum)
        try:
            status = await asyncio.wait_for(asyncio.shield(child.proc.wait()), self._grace)
        except TimeoutError:
            self.notes.append(f"{child.name} (pid {child.pid}) ignored signal {signum} for "
                              f"{self._grace:.0f}s; killed")
            _signal_group(child.pid, signal.SIGKILL)
            status = await child.proc.wait()
        _signal_group(child.pid, signal.SIGKILL)  # whatever it left in its group
        return status

    async def died(self) -> Child:
        """The first child that ended while not being stopped."""
        return await asyncio.shield(self._death())

    async def guard(self, work: Awaitable[T], *, timeout: float, what: str, log: Path) -> T:
        """`work`, unless a child dies first (ChildExited) or `timeout` passes (StackError)."""
        task = asyncio.ensure_future(work)
        death = asyncio.ensure_future(self.died())
        try:
            done, _ = await asyncio.wait({task, death}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            death.cancel()
            if not task.done():  # expired, a child died, or we are cancelled: the work ends too
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if task in done:
            return task.result()
        if death in done and not death.cancelled():
            raise ChildExited(f"while waiting for {what}: {describe_exit(death.result())}")
        raise StackError(f"gave up waiting for {what} after {timeout:.0f}s; see {log}, ending:\n"
                         f"{tail(log)}")

    async def stop(self) -> list[str]:
        """Stop every child, highest tier first; returns a note per child that had to be killed."""
        self._stopping = True
        notes: list[str] = []
        for tier in sorted({c.tier for c in self._children}, reverse=True):
            group = [c for c in self._children if c.tier == tier]
            results = await asyncio.gather(*(self._stop_one(c) for c in group))
            notes.extend(n for n in results if n)
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._record()
        return notes

    async def _stop_one(self, child: Child) -> str | None:
        note = None
        if child.status is None:
            _signal_group(child.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(child.proc.wait(), self._grace)
            except TimeoutError:
                note = (f"{child.name} (pid {child.pid}) ignored SIGTERM for "
                        f"{self._grace:.0f}s; killed")
                _signal_group(child.pid, signal.SIGKILL)
                await child.proc.wait()
        # Whatever the child started in its group and left behind goes too.
        _signal_group(child.pid, signal.SIGKILL)
        return note

    def _record(self) -> None:
        content = {
            "supervisor": os.getpid(),
            "children": {
                c.name: {"pid": c.pid, "process_group": c.pid, "exit_status": c.status}
                for c in self._children
            },
        }
        with contextlib.suppress(OSError):  # a record, never a reason to fail the stack
            write_json(self._pids_file, content)


def _open_log(path: Path, argv: Sequence[str]) -> BinaryIO:
    """The child's log, appended to: a restarted stack keeps the earlier runs' lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "ab")  # noqa: SIM115 - closed by the caller once the child holds its copy
    log.write(f"--- partkeeper up: starting {' '.join(argv)}\n".encode())
    log.flush()
    return log


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
