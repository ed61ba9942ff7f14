"""Direct control of the simulated API server for tests and `partkeeper up`, without HTTP.

Every method is thread-safe: it runs on the server's event loop (see `_run`), the only thread
that touches the store, so an admin change and an HTTP request never interleave.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from . import selectors
from .state import ServerState
from .store import ADDED, Store

T = TypeVar("T")


class Admin:
    """Mixed into ApiServer and ApiServerThread; they provide `_state` and `_run`."""

    _state: ServerState

    def _run(self, fn: Callable[[], T]) -> T:
        raise NotImplementedError

    def with_store(self, fn: Callable[[Store], T]) -> T:
        """Run `fn(store)` on the server's loop: anything the named methods below do not cover."""
        return self._run(lambda: fn(self._state.store))

    # Pods --------------------------------------------------------------------------------

    def create_pod(self, pod: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create as a POST would (defaults, validation); namespace from the Pod or "default"."""
        namespace = namespace or pod.get("metadata", {}).get("namespace") or "default"
        return self.with_store(lambda store: store.create("pods", namespace, pod))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.with_store(lambda store: store.get("pods", namespace, name))

    def list_pods(
        self,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        selector = selectors.parse("pods", field_selector, label_selector)
        return self.with_store(lambda store: store.list("pods", namespace, selector)[0])

    def patch_pod(
        self, namespace: str, name: str, patch: dict[str, Any], *, status: bool = False
    ) -> dict[str, Any]:
        """A JSON merge patch of the Pod, or of its status subresource when `status`."""
        subresource = "status" if status else None
        return self.with_store(
            lambda store: store.patch(
                "pods", namespace, name, "application/merge-patch+json", patch, subresource
            )
        )

    def bind_pod(self, namespace: str, name: str, node: str) -> dict[str, Any]:
        return self.with_store(lambda store: store.bind(namespace, name, node))

    def delete_pod(
        self,
        namespace: str,
        name: str,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> dict[str, Any]:
        options: dict[str, Any] = {"gracePeriodSeconds": grace_period_seconds}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        return self.with_store(lambda store: store.delete("pods", namespace, name, options))

    # Nodes and Events --------------------------------------------------------------------

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        body = {"metadata": {"name": name, "labels": dict(labels or {})}}
        return self.with_store(lambda store: store.create("nodes", "", body))

    def get_node(self, name: str) -> dict[str, Any]:
        return self.with_store(lambda store: store.get("nodes", "", name))

    def patch_node(
        self, name: str, patch: dict[str, Any], *, status: bool = False
    ) -> dict[str, Any]:
        subresource = "status" if status else None
        return self.with_store(
            lambda store: store.patch(
                "nodes", "", name, "application/merge-patch+json", patch, subresource
            )
        )

    def events(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Recorded Events in the core v1 shape, whichever API posted them."""
        everything = selectors.Selector()
        return self.with_store(lambda store: store.list("events", namespace, everything)[0])

    # Faults and history ------------------------------------------------------------------

    def inject(
        self,
        resource: str,
        obj: Any,
        event_type: str = ADDED,
        *,
        key: tuple[str, str] | None = None,
    ) -> Any:
        """Store `obj` unvalidated (a Pod without uid, with uid "../../etc", not a dict...);
        `key` is (namespace, name), needed to change or delete an object that has no name."""
        return self.with_store(lambda store: store.inject(resource, obj, event_type, key=key))

    def send_raw_watch_line(self, resource: str, line: str | bytes) -> int:
        """Write `line` as is to every open watch of `resource`; returns how many got it."""
        data = line.encode() if isinstance(line, str) else line
        data = data if data.endswith(b"\n") else data + b"\n"
        return self._run(lambda: self._state.hub.send_raw(resource, data))

    def compact(self) -> int:
        """Forget the watch history: resuming from any resourceVersion before now gets 410."""
        return self.with_store(lambda store: store.compact())

    @property
    def resource_version(self) -> int:
        return self.with_store(lambda store: store.resource_version)

    def open_watches(self) -> int:
        return self._run(lambda: self._state.hub.open_streams)

    def undelivered_watch_events(self) -> int:
        """Items queued for open watches and not yet written (they pile up while stalled)."""
        return self._run(lambda: self._state.hub.undelivered)

    def set_unavailable(self, unavailable: bool = True) -> None:
        """Answer every request with 503 and end the open watches; False restores service."""

        def switch() -> None:
            self._state.unavailable = unavailable
            if unavailable:
                self._state.hub.end_all()

        self._run(switch)

    def stall_watches(self, stalled: bool = True) -> None:
        """Open watches stop delivering (changes queue up, no bookmarks) until un-stalled."""
        self._run(lambda: self._state.hub.stall(stalled))
