"""The watcher in tests: its fast tunings, the events it published, one running in-process or as
a process.

`start_watcher` (in-process) and `watcher_process` (`python -m services.watcher`) in
tests/conftest.py are the fixtures that run it; watcher and observability tests share them."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from schemas import PodEvent, decode
from services.watcher.tuning import Tuning

ROOT = Path(__file__).resolve().parents[2]
PROCESS_DEADLINE = 20.0  # a watcher process's start and stop, bounded

FAST = Tuning(
    watch_timeout_seconds=5, request_timeout=(2.0, 5.0), retry_base=0.05, retry_cap=0.4
)
# Short retries so the bounded-retry paths of the Event recorder run in milliseconds.
EVENTS_FAST = dataclasses.replace(
    FAST, event_attempts=4, event_retry_base=0.02, event_retry_cap=0.2, lag_interval=0.5
)


@dataclass
class Published:
    """Every Pod event on the node's subjects, in stream order, with its msg id."""

    events: list[tuple[PodEvent, str]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # of each event, in order
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def on_msg(self, msg: Msg) -> None:
        event = decode(msg.data, PodEvent, what="pod event")
        headers = dict(msg.headers or {})
        async with self.changed:
            self.events.append((event, headers.get("Nats-Msg-Id", "")))
            self.headers.append(headers)
            self.changed.notify_all()

    def of(self, uid: str, kind: str | None = None) -> list[PodEvent]:
        return [e for e, _ in self.events
                if e.uid == uid and (kind is None or type(e).__name__ == kind)]

    async def wait(
        self, predicate: Callable[[], Any], timeout: float = 10.0, what: str = ""
    ) -> None:
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(predicate), timeout)
            except TimeoutError:
                kinds = [(type(e).__name__, e.uid[:8], e.resource_version) for e, _ in self.events]
                raise AssertionError(f"timed out waiting for {what}; published: {kinds}") from None

    async def wait_for(self, uid: str, kind: str, count: int = 1, timeout: float = 10.0) -> None:
        await self.wait(lambda: len(self.of(uid, kind)) >= count, timeout,
                        f"{count} {kind} of {uid}")

    async def headers_of(self, uid: str, kind: str, timeout: float = 10.0) -> dict[str, str]:
        """The headers of the first `kind` event of `uid`, waiting for it."""
        await self.wait_for(uid, kind, timeout=timeout)
        return next(h for (e, _), h in zip(self.events, self.headers, strict=True)
                    if e.uid == uid and type(e).__name__ == kind)


@dataclass
class RunningWatcher:
    task: asyncio.Task[None]
    ready: asyncio.Event

    async def stop(self) -> None:
        """Cancel; a watcher that does not end within the deadline fails the test."""
        self.task.cancel()
        done, _ = await asyncio.wait({self.task}, timeout=10)
        assert done, "the watcher did not stop within 10s of being cancelled"


def log_lines(caplog: pytest.LogCaptureFixture, fragment: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if fragment in r.getMessage()]


class WatcherProcess:
    """`python -m services.watcher`, its output in `log`."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    async def exited(self, timeout: float = PROCESS_DEADLINE) -> int:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"the watcher did not exit within {timeout}s; "
                                 f"log:\n{self.tail()}") from None

    async def terminate(self, timeout: float = PROCESS_DEADLINE) -> int:
        """SIGTERM and wait for the exit (the clean path: spans flushed, NATS drained)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.exited(timeout)

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def spawn_watcher(
    *, nats_url: str, node: str, kubeconfig: Path, log: Path, env: dict[str, str]
) -> WatcherProcess:
    """Start the watcher as a process with `env` over the test's environment (less OTEL_*)."""
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "PK_NODE_NAME": node,
        "NATS_URL": nats_url,
        "KUBECONFIG": str(kubeconfig),
        "PK_METRICS_PORT": "0",
        **env,
    }
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.watcher", cwd=ROOT, env=full,
            stdout=out, stderr=out,
        )
    return WatcherProcess(proc, log)
