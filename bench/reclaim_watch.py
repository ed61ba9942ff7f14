"""What the reclaim benchmark observes, each where it is decided, stamped with time.monotonic().

- `HealthStream`: a ListAndWatch client of the allocator's device plugin for one resource, as
  kubelet is one. The allocator sends the whole list to every stream whenever a token's health
  changes, so this sees what the simulated kubelet sees, when it could see it, without asking
  the kubelet anything (asking would add load to the very process under observation).
- `HardwareWatch`: the simulated cards, read from the state file without taking its lock. The
  driver replaces the file atomically (write, fsync, rename), so a lock-free read always sees a
  whole state; taking the lock would make the allocator and reclaimer wait on the benchmark,
  and the lock's waiters poll every 50 ms, which is the order of what is measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from partkeeper.kubelet import (
    HEALTHY,
    deviceplugin_pb2,
    deviceplugin_pb2_grpc,
    open_unix_channel,
    wait_ready,
)

CONNECT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Update:
    """One ListAndWatch response: when it arrived and how many of the tokens were Healthy."""

    at: float
    healthy: int
    total: int

    @property
    def whole(self) -> bool:
        return self.total > 0 and self.healthy == self.total


class HealthStream:
    """Every ListAndWatch response of one plugin socket, in arrival order."""

    def __init__(self, socket: Path, on_update: Callable[[], None] = lambda: None) -> None:
        self.socket = socket
        self.updates: list[Update] = []
        self.ended: str | None = None  # why the stream stopped, if it did
        self._on_update = on_update
        self._changed = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._channel = open_unix_channel(self.socket)
        await wait_ready(self._channel, CONNECT_SECONDS)
        self._task = asyncio.create_task(self._read(self._channel), name="bench ListAndWatch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()

    async def _read(self, channel: grpc.aio.Channel) -> None:
        stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
        call = stub.ListAndWatch(deviceplugin_pb2.Empty())
        try:
            async for response in call:
                healthy = sum(1 for d in response.devices if d.health == HEALTHY)
                self.updates.append(Update(time.monotonic(), healthy, len(response.devices)))
                self._wake()
            self.ended = "the allocator closed the stream"
        except grpc.aio.AioRpcError as exc:
            self.ended = f"the stream failed: {exc.code().name} {exc.details()}"
        finally:
            call.cancel()
            self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        self._on_update()

    async def next_update(self, deadline: float) -> bool:
        """Wait for the next response (or the stream's end) until `deadline`; False on expiry."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), remaining)
            return True
        return False


class HardwareWatch:
    """The instance UUIDs on the simulated cards, re-read whenever the state file is replaced.

    A thread polls the file's identity every `interval` seconds, so the moment an instance is
    seen gone is late by at most about that much (plus a read and a parse, well under a
    millisecond for this file); it is stamped after the read, never before the change.
    """

    def __init__(
        self, path: Path, interval: float, on_change: Callable[[], None] = lambda: None
    ) -> None:
        self.path = path
        self.interval = interval
        self.error: str | None = None
        self._on_change = on_change
        self._loop: asyncio.AbstractEventLoop | None = None
        self._uuids: frozenset[str] = frozenset()
        self._watches: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench sim state", daemon=True)
        self._seen: tuple[int, int, int] | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._poll()  # the first read fails loudly here, not silently in the thread
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def uuids(self) -> frozenset[str]:
        return self._uuids

    def gone(self, uuid: str) -> asyncio.Future[float]:
        """Resolved with the time `uuid` was first seen absent (it must be present now)."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        with self._lock:
            if uuid not in self._uuids:
                raise ValueError(f"{uuid} is not on the simulated cards")
            self._watches[uuid] = (asyncio.get_running_loop(), future)
        return future

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._poll()
            except (OSError, ValueError) as exc:
                # Reported with the figures; a cycle waiting on it then misses its deadline.
                self.error = f"reading the simulated cards failed: {exc}"

    def _poll(self) -> None:
        st = os.stat(self.path)
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        if identity == self._seen:
            return
        raw = self.path.read_bytes()
        at = time.monotonic()
        state = json.loads(raw)
        self._seen = identity
        uuids = frozenset(i["uuid"] for card in state["cards"] for i in card["instances"])
        with self._lock:
            changed, self._uuids = uuids != self._uuids, uuids
            for uuid in [u for u in self._watches if u not in uuids]:
                loop, future = self._watches.pop(uuid)
                loop.call_soon_threadsafe(_resolve, future, at)
        if changed and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
                self._loop.call_soon_threadsafe(self._on_change)


def _resolve(future: asyncio.Future[float], at: float) -> None:
    if not future.done():
        future.set_result(at)


def latency_ms(path: Path) -> dict[str, int]:
    """The simulated driver's configured create/destroy latencies (the benchmark wants none)."""
    state = json.loads(path.read_bytes())
    return {op: int(ms) for op, ms in (state.get("latency_ms") or {}).items()}
