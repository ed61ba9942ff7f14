"""The watcher in tests: its fast tunings, the events it published, one running in-process.

`start_watcher` in tests/conftest.py is the one fixture that runs it; watcher and observability
tests share it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from nats.aio.msg import Msg

from schemas import PodEvent, decode
from services.watcher.tuning import Tuning

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
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def on_msg(self, msg: Msg) -> None:
        event = decode(msg.data, PodEvent, what="pod event")
        async with self.changed:
            self.events.append((event, (msg.headers or {}).get("Nats-Msg-Id", "")))
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
