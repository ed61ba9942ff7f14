"""Reading a watch (bus/ordered.py, bus/kv.py) in a task of its own, for the tests to look at."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import TypedDict

from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from partkeeper.bus.ordered import OrderedWatch


class Timings(TypedDict):
    heartbeat: float
    inactive: float


FAST = Timings(heartbeat=0.2, inactive=2.0)  # a lost consumer is noticed within 0.6 s


class Reader:
    """Everything an ordered watch hands out."""

    def __init__(self, watch: OrderedWatch) -> None:
        self.watch = watch
        self.msgs: list[Msg] = []
        self.caught_up = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async with self.watch:
            async for msg in self.watch:
                if msg is None:
                    self.caught_up.set()
                else:
                    self.msgs.append(msg)

    @property
    def data(self) -> list[bytes]:
        return [m.data for m in self.msgs]

    @property
    def sequences(self) -> list[int]:
        return [m.metadata.sequence.stream for m in self.msgs]


class Entries:
    """Everything a KV watch (bus/kv.py `watch`) hands out."""

    def __init__(self, watch: AsyncGenerator[KeyValue.Entry | None, None]) -> None:
        self.got: list[KeyValue.Entry] = []
        self.caught_up = asyncio.Event()
        self.task = asyncio.create_task(self._read(watch))

    async def _read(self, watch: AsyncGenerator[KeyValue.Entry | None, None]) -> None:
        async with contextlib.aclosing(watch) as entries:
            async for entry in entries:
                if entry is None:
                    self.caught_up.set()
                else:
                    self.got.append(entry)

    def keys(self) -> list[str]:
        return [e.key for e in self.got]
