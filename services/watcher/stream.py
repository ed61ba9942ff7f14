"""One watch request, run by `kubernetes.watch.Watch().stream` in its own thread.

The client's stream blocks, so it lives in a thread that hands each event to the event loop with
`call_soon_threadsafe`; the loop reads them from `queue`, in order, ending with `Ended`. Stopping
shuts the socket down (Watch.stop), and the request carries `timeout_seconds` and a read timeout,
so the thread ends promptly even on a server that sends nothing.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from kubernetes import watch

from services.watcher.kube import Kube


@dataclass(frozen=True, slots=True)
class Ended:
    """The stream is over: `error` is None when the server closed it (timeout_seconds)."""

    error: BaseException | None


# A decoded event, None for a line that was not JSON, or the end.
Item = dict[str, Any] | None | Ended


class WatchRequest:
    def __init__(
        self,
        kube: Kube,
        resource_version: str,
        *,
        timeout_seconds: int,
        read_slack: float = 10.0,
    ) -> None:
        self.kube = kube
        self.resource_version = resource_version
        self.timeout_seconds = timeout_seconds
        self.read_slack = read_slack
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._watch = watch.Watch()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"pk-watch-from-{resource_version}", daemon=True
        )

    def start(self) -> WatchRequest:
        self._thread.start()
        self.kube.watch_threads.add(self._thread)
        return self

    def stop(self) -> None:
        """Ask the thread to end; it does at the next event, or when its socket is shut."""
        self._stopping.set()
        self._watch.stop()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        error: BaseException | None = None
        connect_timeout = self.kube.request_timeout[0]
        try:
            for event in self._watch.stream(
                self.kube.watch_call,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.timeout_seconds,
                _request_timeout=(connect_timeout, self.timeout_seconds + self.read_slack),
            ):
                if self._stopping.is_set():
                    break
                self._post(event)
        except BaseException as exc:  # handed to the loop, which decides what happens next
            if not self._stopping.is_set():
                error = exc
        self._post(Ended(error))

    def _post(self, item: Item) -> None:
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            # The event loop is closed: the service is gone and nobody reads the queue.
            self._stopping.set()

