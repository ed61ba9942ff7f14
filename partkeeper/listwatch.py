"""One list-watch of the Kubernetes API for every reader: the watcher, the simulated kubelet and
the demo.

`ListWatch.items()` LISTs when it has no version to resume from, then WATCHes from the LIST's
version; a watch request the server ends (its `timeout_seconds`) is followed by another from the
last version seen, events' and bookmarks' alike. It yields `Listed` after each LIST and `Event`
for each watch line. 410 Gone raises `Expired` with the resume point cleared, so the next
iteration LISTs afresh; a watch that ends at once without delivering anything raises
`EndedAtOnce`; any other failure of the watch raises `WatchFailed` (and one of `list_call`
propagates as it is), with the resume point kept.
The caller decides how long to back off before iterating again. The resume point moves past an
event only once the caller has taken it (asked for the next item), so an event whose handling
failed is read again.

`follow` is the loop every long-lived reader runs over `items()`: an expired watch lists again at
once, as the client-go reflector does; a failed one (the API server unreachable, a watch that ends
at once) lists again after a backoff.

The `kubernetes` client is blocking: the LIST runs in a worker thread (the caller's
`list_call`), and each watch request in its own thread that hands every event to the event loop
(`call_soon_threadsafe`), in order. Leaving the iteration, or cancelling it, stops the request
(`Watch.stop` shuts its socket), and every request carries `timeout_seconds` and a read timeout,
so the thread ends promptly even on a server that sends nothing. Why threads and not an asyncio
client: docs/watcher.md, "One list-watch, on threads", with the measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableSet
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from partkeeper import backoff

log = logging.getLogger(__name__)

T = TypeVar("T")
GONE = 410

# A decoded watch event ({"type": ..., "object": <raw JSON>}), or None for a line that was not
# JSON: the client's stream yields that, and the reader decides what it means.
RawEvent = dict[str, Any] | None


class Expired(Exception):
    """410 Gone: the version to resume from is older than the server's history; LIST again."""


class EndedAtOnce(Exception):
    """A watch request ended normally, delivering nothing, well before its timeout."""


class WatchFailed(Exception):
    """The watch request raised `error` (the server, the connection, or a line the client could
    not take apart); the resume point is kept."""

    def __init__(self, message: str, error: BaseException) -> None:
        super().__init__(message)
        self.error = error


@dataclass(frozen=True, slots=True)
class Listed(Generic[T]):
    """A LIST was made: what `list_call` returned, and the version the watch resumes from."""

    resource_version: str
    value: T


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a watch: the decoded event, or None for a line that was not JSON, and when
    it arrived (time.monotonic(), stamped by the reading thread)."""

    raw: RawEvent
    at: float

    @property
    def type(self) -> str:
        return str(self.raw.get("type", "")) if isinstance(self.raw, dict) else ""

    @property
    def object(self) -> Any:
        return self.raw.get("object") if isinstance(self.raw, dict) else None


@dataclass(frozen=True, slots=True)
class _Ended:
    error: BaseException | None  # None: the server closed the request (timeout_seconds)


class WatchRequest:
    """One watch request in its own thread; `next()` returns its items in order on the loop."""

    def __init__(self, call: Callable[..., Any], resource_version: str, *, timeout_seconds: int,
                 request_timeout: tuple[float, float]) -> None:
        self.timeout_seconds = timeout_seconds
        self._queue: asyncio.Queue[tuple[RawEvent, float] | _Ended] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._watch = watch.Watch()
        self._stopping = threading.Event()
        self._args = (call, resource_version, request_timeout)
        self.thread = threading.Thread(
            target=self._run, name=f"pk-watch-from-{resource_version}", daemon=True
        )

    def start(self) -> WatchRequest:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Ask the thread to end; it does at the next event, or when its socket is shut."""
        self._stopping.set()
        self._watch.stop()

    async def next(self) -> tuple[RawEvent, float] | _Ended:
        return await self._queue.get()

    def _run(self) -> None:
        call, resource_version, request_timeout = self._args

        def raw(**kwargs: Any) -> Any:
            # No declared model type: the stream hands back the raw JSON objects, which the
            # readers need (the client's models refuse malformed Pods a reader must skip).
            return call(**kwargs)

        error: BaseException | None = None
        try:
            for event in self._watch.stream(
                raw, resource_version=resource_version, allow_watch_bookmarks=True,
                timeout_seconds=self.timeout_seconds,
                _request_timeout=(request_timeout[0], self.timeout_seconds + request_timeout[1]),
            ):
                if self._stopping.is_set():
                    break
                self._post((event, time.monotonic()))
        except BaseException as exc:  # handed to the loop, which decides what happens next
            if not self._stopping.is_set():
                error = exc
        self._post(_Ended(error))

    def _post(self, item: tuple[RawEvent, float] | _Ended) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            # The event loop is closed: the reader is gone and nobody reads the queue.
            self._stopping.set()


def resource_version_of(raw: RawEvent) -> str | None:
    """The version a watch event carries (its object's), or None when it has none."""
    obj = raw.get("object") if isinstance(raw, dict) else None
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return str(version) if isinstance(version, str | int) and str(version) else None


class ListWatch(Generic[T]):
    """LIST then WATCH, resuming, for one collection. See the module's docstring."""

    def __init__(
        self,
        list_call: Callable[[], Awaitable[tuple[str, T]]],
        watch_call: Callable[..., Any],
        *,
        timeout_seconds: int,
        request_timeout: tuple[float, float] = (10.0, 30.0),
        threads: MutableSet[threading.Thread] | None = None,
    ) -> None:
        self._list = list_call
        self._watch_call = watch_call
        self.timeout_seconds = timeout_seconds
        self.request_timeout = request_timeout
        # The watch threads started, for whoever closes the client (it must not pull the client
        # from under a thread still inside it).
        self.threads: MutableSet[threading.Thread] = (
            threads if threads is not None else weakref.WeakSet()
        )
        self.resume_from: str | None = None  # None: LIST first
        self._request: WatchRequest | None = None

    def stop(self) -> None:
        """Stop the watch request in flight (from another task, e.g. at shutdown)."""
        if self._request is not None:
            self._request.stop()

    async def items(self) -> AsyncGenerator[Listed[T] | Event, None]:
        while True:
            if self.resume_from is None:
                version, value = await self._list()
                yield Listed(version, value)
                self.resume_from = version
            async with contextlib.aclosing(self._watch_once(self.resume_from)) as events:
                async for event in events:
                    yield event
                    self.resume_from = resource_version_of(event.raw) or self.resume_from

    async def _watch_once(self, version: str) -> AsyncGenerator[Event, None]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        request = WatchRequest(self._watch_call, version, timeout_seconds=self.timeout_seconds,
                               request_timeout=self.request_timeout)
        self._request = request.start()
        self.threads.add(request.thread)
        delivered = False
        try:
            while not isinstance(item := await request.next(), _Ended):
                delivered = True
                yield Event(*item)
        finally:
            request.stop()
            self._request = None
        if item.error is not None:
            if isinstance(item.error, ApiException) and item.error.status == GONE:
                self.resume_from = None
                raise Expired(f"watch from resourceVersion {version}: {item.error.reason}".strip()
                              ) from item.error
            raise WatchFailed(f"watch from resourceVersion {version}: {item.error!r}",
                              item.error) from item.error
        if not delivered and loop.time() - started < request.timeout_seconds / 2:
            raise EndedAtOnce(f"the watch from resourceVersion {version} ended at once")


async def follow(
    what: str,
    listwatch: ListWatch[T],
    take: Callable[[Listed[T] | Event], None],
    *,
    lost: Callable[[], None] = lambda: None,
    doing: str = "listing again",
    failing: tuple[type[BaseException], ...] = (),
) -> NoReturn:
    """Hand every LIST and watch event of `listwatch` to `take`, until cancelled (module
    docstring). `lost` hears of every expiry and failure, so a reader that lets others wait on
    its events knows it no longer may; `failing` adds the errors the caller's own `list_call`
    raises to the API server's and the connection's."""
    failures = backoff.Failures(what, backoff.Schedule(cap=10.0))
    transient = (EndedAtOnce, WatchFailed, ApiException, HTTPError, OSError, *failing)
    while True:
        try:
            async with contextlib.aclosing(listwatch.items()) as items:
                async for item in items:
                    take(item)
                    failures.succeeded()
        except Expired:
            lost()
            log.info("%s: the watch expired; listing again", what)
        except transient as exc:
            lost()
            listwatch.resume_from = None
            await asyncio.sleep(failures.failed(exc, doing))
