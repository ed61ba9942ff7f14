"""Test support for the simulated API server reached with the real `kubernetes` client."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

Event = dict[str, Any] | None


def core_v1(kubeconfig_path: str | Path) -> client.CoreV1Api:
    """A CoreV1Api configured from a kubeconfig file, independent of the global default."""
    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig_path)))


def pod_manifest(name: str, node: str | None = "node-a", **spec: Any) -> dict[str, Any]:
    """A minimal valid Pod body, bound to `node` unless it is None."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


class WatchRecorder:
    """Runs `kubernetes.watch.Watch().stream(func, ...)` in a thread, recording what it yields.

    The client's generator blocks, so it lives in a thread; the test waits on the recorded
    events with a deadline. `error` holds what the stream raised, unless the test stopped it.
    """

    def __init__(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.events: list[Event] = []
        self.error: BaseException | None = None
        self.finished = False
        self._condition = threading.Condition()
        self._watch = watch.Watch()
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, args=(func, args, kwargs), name="watch-recorder", daemon=True
        )

    def start(self) -> WatchRecorder:
        self._thread.start()
        return self

    def _run(self, func: Callable[..., Any], args: Any, kwargs: Any) -> None:
        try:
            for event in self._watch.stream(func, *args, **kwargs):
                with self._condition:
                    self.events.append(event)
                    self._condition.notify_all()
        except BaseException as error:
            if not self._stopping:
                self.error = error
        finally:
            with self._condition:
                self.finished = True
                self._condition.notify_all()

    def wait_for(
        self, predicate: Callable[[list[Event]], bool], timeout: float = 10.0, what: str = ""
    ) -> list[Event]:
        """The events so far, once `predicate(events)` holds; fails at the deadline or if the
        stream ended without it holding."""
        with self._condition:
            self._condition.wait_for(lambda: predicate(self.events) or self.finished, timeout)
            if not predicate(self.events):
                raise AssertionError(
                    f"watch did not produce {what or predicate}: finished={self.finished} "
                    f"error={self.error!r} events={[_describe(e) for e in self.events]}"
                )
            return list(self.events)

    def wait_count(
        self, count: int, event_type: str | None = None, timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """The decoded events (of `event_type`), once there are `count` of them."""
        def enough(events: list[Event]) -> bool:
            return len(of_type(events, event_type)) >= count

        return of_type(
            self.wait_for(enough, timeout, f"{count} {event_type or ''} events"), event_type
        )

    def wait_finished(self, timeout: float = 10.0) -> list[Event]:
        with self._condition:
            if not self._condition.wait_for(lambda: self.finished, timeout):
                raise AssertionError(f"watch still running after {timeout}s")
            return list(self.events)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._watch.stop()
        self._thread.join(timeout)


def of_type(events: list[Event], event_type: str | None) -> list[dict[str, Any]]:
    """The decoded events (the client yields None for a line it cannot decode), only those of
    `event_type` unless it is None."""
    return [e for e in events if e is not None and (event_type is None or e["type"] == event_type)]


def _describe(event: Event) -> str:
    if event is None:
        return "None"
    obj = event.get("raw_object", event.get("object"))
    metadata = (obj.get("metadata") if isinstance(obj, dict) else None) or {}
    return f"{event['type']}:{metadata.get('name')}@{metadata.get('resourceVersion')}"
