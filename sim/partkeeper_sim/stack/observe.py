"""What the demo sees happen, and the wake-ups its waits re-check on.

Three sources, each pushed, none polled: the Kubernetes Pod watch (phases, deletions), the
partition audit log on NATS (`pk.parts.<node>.*`: claim transitions, foreign instances) and the
allocator's capacity document (a KV watch). Each arrival wakes every waiter; waiters then read the
state they care about fresh (the wake-up carries no data). A waiter also re-checks once a second,
so a source that stays silent delays a step by at most that much instead of stalling it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from partkeeper.lifecycle import honour_cancel, woken_or_timeout
from partkeeper_sim.stack.kube import PodChange
from schemas import ClaimChanged, ForeignFound, SchemaError, decode
from schemas.events import PartitionEvent
from schemas.names import BUCKET_CAPACITY, capacity_key, parts_filter

T = TypeVar("T")
RECHECK_SECONDS = 1.0
_NOT_ADMITTED = ("Failed", "Succeeded")


class DemoError(Exception):
    """A step of the demo did not happen in time or went wrong; the message says which."""


@dataclass(slots=True)
class PodTrack:
    """One demo Pod from creation to reclaim, stamped with time.monotonic()."""

    name: str
    resource: str
    kind: str  # "partition" or "slice"
    created: float
    uid: str = ""
    phase: str = "Pending"
    bound: float | None = None
    running: float | None = None
    refused: str = ""  # reason and message when it ended without running
    deleted: float | None = None
    gone: float | None = None
    instance: str = ""  # the MIG device UUID of its partition
    reclaimed: float | None = None
    busy_released: float | None = None  # set for the Pod whose instance was held busy
    refill_of: str = ""  # the Pod deleted just before this one was created, for its room

    @property
    def settled(self) -> bool:
        return self.running is not None or bool(self.refused)


@dataclass(slots=True)
class Wakeups:
    count: int = 0
    _events: set[asyncio.Event] = field(default_factory=set)

    def touch(self) -> None:
        self.count += 1
        for event in self._events:
            event.set()

    @contextlib.contextmanager
    def listen(self) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self._events.add(event)
        try:
            yield event
        finally:
            self._events.discard(event)

    async def until(
        self, check: Callable[[], Awaitable[T | None]], *, timeout: float, what: str, hint: str
    ) -> T:
        """The first truthy result of `check()`, re-run on every wake-up; DemoError on expiry."""
        deadline = time.monotonic() + timeout
        with self.listen() as woken:
            while True:
                honour_cancel()
                woken.clear()  # before checking, so a change during the check is not lost
                result = await check()
                if result:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DemoError(f"{what}: not after {timeout:.0f}s; {hint}")
                await woken_or_timeout(woken, min(remaining, RECHECK_SECONDS))


class Observer:
    def __init__(self, nc: Client, node: str) -> None:
        self.nc = nc
        self.node = node
        self.wakeups = Wakeups()
        self.pods: dict[str, PodTrack] = {}
        self.foreign_seen: set[str] = set()
        self.claim_removed: dict[str, float] = {}  # Pod UID -> when its claim's removal arrived
        self._subscription: Subscription | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._subscription = await self.nc.subscribe(parts_filter(self.node), cb=self._on_part)
        self._tasks.append(asyncio.create_task(self._watch_capacity(), name="demo capacity"))

    async def stop(self) -> None:
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def track(self, pod: PodTrack) -> PodTrack:
        self.pods[pod.name] = pod
        return pod

    def on_pod(self, change: PodChange) -> None:
        pod = self.pods.get(change.name)
        if pod is None or (pod.uid and change.uid and pod.uid != change.uid):
            return
        if change.kind == "DELETED":
            pod.gone = pod.gone or change.at
        else:
            pod.phase = change.phase or pod.phase
            if change.phase == "Running" and pod.running is None:
                pod.running = change.at
            elif change.phase in _NOT_ADMITTED and pod.running is None and not pod.refused:
                pod.refused = f"{change.reason or change.phase}: {change.message}".strip(": ")
        self.wakeups.touch()

    async def _on_part(self, msg: Msg) -> None:
        self.wakeups.touch()  # whatever it says, something changed
        try:
            event = decode(msg.data, PartitionEvent, what="partition event")
        except SchemaError:
            return  # not ours to judge; what matters is read fresh by the waiters
        if isinstance(event, ForeignFound):
            self.foreign_seen.add(event.instance_uuid)
        elif isinstance(event, ClaimChanged) and event.state == "removed":
            self.claim_removed.setdefault(event.pod_uid, time.monotonic())

    async def _watch_capacity(self) -> None:
        """Every capacity document the allocator publishes is a wake-up."""
        kv = await self.nc.jetstream().key_value(BUCKET_CAPACITY)
        honour_cancel()
        watcher = await kv.watch(capacity_key(self.node))
        try:
            honour_cancel()
            async for _ in watcher:
                honour_cancel()
                self.wakeups.touch()
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()
