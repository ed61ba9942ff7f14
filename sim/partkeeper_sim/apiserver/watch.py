"""Watch streams: the store's changes fanned out to each open watch, with bookmarks and timeouts.

A stream is opened synchronously (initial events computed and the stream registered in one step
on the event loop, so no change can fall between them), then pumped: every change reaches the
stream's queue the moment the store commits it, and the pump writes it out. Nothing polls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from . import kinds
from .errors import ApiError
from .selectors import Selector
from .store import ADDED, Change, Store

BOOKMARK, ERROR = "BOOKMARK", "ERROR"
Write = Callable[[bytes], Awaitable[None]]
# What a stream's queue carries: a change, a raw line injected by a test, or the end.
Item = Change | bytes | None


def event_line(event_type: str, obj: Any) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


@dataclass(eq=False)
class WatchStream:
    resource: str
    namespace: str | None
    selector: Selector
    initial: list[tuple[str, Any]]
    queue: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)
    held: Any = None

    @property
    def undelivered(self) -> int:
        """Changes and raw lines taken from the store but not yet written (e.g. while stalled)."""
        held = self.held is not None and self.held is not _BOOKMARK_DUE
        return self.queue.qsize() + held

    def event_for(self, change: Change) -> tuple[str, Any] | None:
        if self.namespace is not None and change.namespace != self.namespace:
            return None
        return change.seen_through(self.selector)


class WatchHub:
    """Every open watch stream, and the switches tests use to disturb them."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._streams: set[WatchStream] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        store.subscribe(self._on_change)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def undelivered(self) -> int:
        return sum(stream.undelivered for stream in self._streams)

    def open(
        self, resource: str, namespace: str | None, selector: Selector, since: int | None
    ) -> WatchStream:
        """Register a stream; raises Expired when `since` is older than the retained history.

        Without `since` the stream starts with a synthetic ADDED for every matching object, as a
        real watch from resourceVersion "" or "0" does.
        """
        if since is None:
            objects = self._store.snapshot(resource, namespace, selector)
            initial = [(ADDED, obj) for obj in objects]
        else:
            probe = WatchStream(resource, namespace, selector, [])
            changes = self._store.changes_since(resource, since)
            initial = [e for e in map(probe.event_for, changes) if e is not None]
        stream = WatchStream(resource, namespace, selector, initial)
        self._streams.add(stream)
        return stream

    def close(self, stream: WatchStream) -> None:
        self._streams.discard(stream)

    def end_all(self) -> None:
        """End every open stream cleanly, as a server shutting down does."""
        for stream in self._streams:
            stream.queue.put_nowait(None)

    def send_raw(self, resource: str, line: bytes) -> int:
        """Write `line` (not validated) to every open stream of `resource`; returns how many."""
        targets = [s for s in self._streams if s.resource == resource]
        for stream in targets:
            stream.queue.put_nowait(line)
        return len(targets)

    def stall(self, stalled: bool) -> None:
        """While stalled, open streams deliver nothing (changes queue up) and send no bookmarks."""
        if stalled:
            self._flowing.clear()
        else:
            self._flowing.set()

    def _on_change(self, change: Change) -> None:
        for stream in self._streams:
            if stream.resource == change.resource:
                stream.queue.put_nowait(change)

    async def pump(
        self,
        stream: WatchStream,
        write: Write,
        *,
        bookmark_every: float | None,
        convert: Callable[[Any], Any] = lambda obj: obj,
    ) -> None:
        """Write the stream's events until it ends; the caller bounds it with timeoutSeconds.

        `convert` shows a stored object as the watching API does (events.k8s.io renames fields).
        """
        loop = asyncio.get_running_loop()
        kind = kinds.KINDS[stream.resource]
        await self._flowing.wait()
        for event_type, obj in stream.initial:
            await write(event_line(event_type, convert(obj)))
        next_bookmark = loop.time() + bookmark_every if bookmark_every else None
        while True:
            item = await _next(stream.queue, next_bookmark, loop)
            # A stall holds what was taken, so nothing is written until it is lifted.
            stream.held = item
            await self._flowing.wait()
            stream.held = None
            if item is _BOOKMARK_DUE:
                if stream.queue.empty():
                    # Nothing pending: every change up to the store's version is delivered.
                    await write(event_line(BOOKMARK, self._bookmark(kind)))
                next_bookmark = loop.time() + (bookmark_every or 0)
            elif item is None:
                return
            elif isinstance(item, bytes):
                await write(item)
            elif (event := stream.event_for(item)) is not None:
                await write(event_line(event[0], convert(event[1])))

    def _bookmark(self, kind: kinds.Kind) -> dict[str, Any]:
        return {
            "kind": kind.kind,
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self._store.resource_version)},
        }


_BOOKMARK_DUE: Any = object()


async def _next(
    queue: asyncio.Queue[Item], deadline: float | None, loop: asyncio.AbstractEventLoop
) -> Any:
    """The next queued item; ready items go first, so a due bookmark waits for a drained queue."""
    if not queue.empty():
        return queue.get_nowait()
    if deadline is None:
        return await queue.get()
    remaining = deadline - loop.time()
    if remaining <= 0:
        return _BOOKMARK_DUE
    # asyncio.timeout, not wait_for: on Python 3.11 wait_for can drop the cancel aiohttp sends
    # a handler whose client went away, and the handler would then outlive the server's stop.
    try:
        async with asyncio.timeout(remaining):
            return await queue.get()
    except TimeoutError:
        return _BOOKMARK_DUE


def error_line(error: ApiError) -> bytes:
    return event_line(ERROR, error.status())
