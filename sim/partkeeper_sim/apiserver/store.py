"""The object store: objects by resource, one resourceVersion counter, and the watch history.

Pure and synchronous: no I/O, no asyncio, no locks. The HTTP layer calls it from the event loop
thread only, so every method runs to completion without interleaving; that is what makes "read
the history, then subscribe" atomic for a new watch.

Every change goes through `_commit`, the one writer: it assigns the next resourceVersion, stores
(or removes) the object, appends a `Change` to the history and tells the listeners.
"""

from __future__ import annotations

import builtins
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from . import kinds, patch, resourceslice
from .clone import clone
from .errors import AlreadyExists, BadRequest, Conflict, Expired, Invalid, not_found
from .selectors import Selector

Key = tuple[str, str]
Listener = Callable[["Change"], None]
ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Change:
    """One entry of the watch history. `obj` is the object after the change (for DELETED, the
    final object at the deletion's resourceVersion); `prev` the object before, if any."""

    rv: int
    resource: str
    namespace: str
    type: str
    obj: Any
    prev: Any = None

    def seen_through(self, selector: Selector) -> tuple[str, Any] | None:
        """The event a watcher with `selector` receives, or None.

        As the real watch cache does: an object that starts matching is ADDED, one that stops
        matching is DELETED (with its previous content at this resourceVersion).
        """
        now = self.type != DELETED and _matches(selector, self.obj)
        before = self.prev is not None and _matches(selector, self.prev)
        if now:
            return (MODIFIED if before else ADDED), self.obj
        if before:
            gone = self.obj if self.type == DELETED else _with_rv(self.prev, self.rv)
            return DELETED, gone
        return None


def _matches(selector: Selector, obj: Any) -> bool:
    return isinstance(obj, dict) and selector.matches(obj)


def _with_rv(obj: Any, rv: int) -> Any:
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return obj
    copied = clone(obj)
    copied["metadata"]["resourceVersion"] = str(rv)
    return copied


def parse_rv(text: str | None) -> int | None:
    """A resourceVersion query parameter: None for unset, "" and "0" ("any")."""
    if text in (None, "", "0"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f'invalid resource version "{text}"') from None
    if value < 0:
        raise BadRequest(f'invalid resource version "{text}"')
    return value


class Store:
    """Pods, Nodes and Events by (namespace, name), with the history watches resume from."""

    def __init__(
        self, *, history_limit: int = 10_000, clock: Callable[[], datetime] = _utcnow,
        partitionable_devices: bool = True,
    ) -> None:
        self._objects: dict[str, dict[Key, Any]] = {name: {} for name in kinds.KINDS}
        # Start above zero: "0" means "any version" to a watch, never a real one.
        self._rv = 1
        self._history: deque[Change] = deque()
        self._history_limit = history_limit
        self._compacted = 1
        self._listeners: list[Listener] = []
        self.clock = clock
        # The kube-apiserver feature gate DRAPartitionableDevices (off by default on 1.34 and
        # 1.35): off, ResourceSlices lose their counter fields silently (resourceslice.py).
        self.partitionable_devices = partitionable_devices

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def compacted_rv(self) -> int:
        """Watches may resume from this resourceVersion or any later one."""
        return self._compacted

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    # Reads -------------------------------------------------------------------------------

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self._objects[resource].get(self._key(resource, namespace, name))
        if obj is None:
            raise not_found(resource, name)
        return clone(obj)

    def list(
        self, resource: str, namespace: str | None, selector: Selector
    ) -> tuple[builtins.list[Any], str]:
        """Matching objects ordered by (namespace, name), and the collection's resourceVersion."""
        return clone(self.snapshot(resource, namespace, selector)), str(self._rv)

    def snapshot(
        self, resource: str, namespace: str | None, selector: Selector
    ) -> builtins.list[Any]:
        """Matching objects, uncopied: for callers that only serialise them."""
        items = sorted(self._objects[resource].items())
        return [
            obj
            for (ns, _), obj in items
            if (namespace is None or ns == namespace) and _matches(selector, obj)
        ]

    def changes_since(self, resource: str, rv: int) -> builtins.list[Change]:
        """Changes of `resource` after `rv`; Expired when some were dropped from the history."""
        if rv < self._compacted:
            raise Expired(f"too old resource version: {rv} ({self._compacted})")
        return [c for c in self._history if c.rv > rv and c.resource == resource]

    # Writes ------------------------------------------------------------------------------

    def create(self, resource: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        kind = kinds.KINDS[resource]
        obj = kinds.new_object(kind, body, namespace, self.clock())
        self._admit(resource, obj, None)
        key = self._key(resource, namespace, obj["metadata"]["name"])
        if key in self._objects[resource]:
            raise AlreadyExists(
                f'{resource} "{key[1]}" already exists',
                details={"name": key[1], "kind": resource},
            )
        return clone(self._commit(resource, key, ADDED, obj).obj)

    def replace(
        self,
        resource: str,
        namespace: str,
        name: str,
        body: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """PUT: optimistic concurrency on metadata.resourceVersion when the body carries one."""
        return self._update(resource, namespace, name, lambda _: body, subresource)

    def patch(
        self,
        resource: str,
        namespace: str,
        name: str,
        content_type: str,
        document: Any,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        def patched(current: dict[str, Any]) -> dict[str, Any]:
            return patch.apply(content_type, current, document)

        return self._update(resource, namespace, name, patched, subresource)

    def _update(
        self,
        resource: str,
        namespace: str,
        name: str,
        propose: Callable[[dict[str, Any]], dict[str, Any]],
        subresource: str | None,
    ) -> dict[str, Any]:
        key = self._key(resource, namespace, name)
        current = self._objects[resource].get(key)
        if current is None:
            raise not_found(resource, name)
        if not kinds.well_formed(current):
            raise Invalid(f'{resource} "{name}" is stored malformed; only inject() may change it')
        proposed = propose(clone(current))
        if not isinstance(proposed, dict):
            raise BadRequest("the object must be a JSON object")
        self._check_version(resource, current, proposed)
        updated = kinds.updated_object(kinds.KINDS[resource], current, proposed, subresource)
        self._admit(resource, updated, current)
        if updated == current:
            # A no-op update writes nothing, as on the real server: no new version, no event.
            return clone(current)
        return clone(self._commit(resource, key, MODIFIED, updated).obj)

    def _admit(self, resource: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if resource == "resourceslices":
            resourceslice.admit(obj, old, partitionable=self.partitionable_devices)

    def bind(self, namespace: str, name: str, node_name: str) -> dict[str, Any]:
        """The binding subresource: the one way a Pod's spec.nodeName is set after creation."""
        key = self._key("pods", namespace, name)
        pod = self._objects["pods"].get(key)
        if pod is None:
            raise not_found("pods", name)
        if not kinds.well_formed(pod) or not isinstance(pod.get("spec"), dict):
            raise Invalid(f'pods "{name}" is stored malformed; only inject() may change it')
        bound = pod["spec"].get("nodeName")
        if bound or pod["metadata"].get("deletionTimestamp"):
            reason = f"is already assigned to node {bound!r}" if bound else "is being deleted"
            raise Conflict(
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} {reason}'
            )
        updated = clone(pod)
        updated["spec"]["nodeName"] = node_name
        status = updated.setdefault("status", {})
        status["conditions"] = [
            *status.get("conditions", []),
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": kinds.timestamp(self.clock()),
            },
        ]
        return clone(self._commit("pods", key, MODIFIED, updated).obj)

    @staticmethod
    def _check_version(resource: str, current: dict[str, Any], proposed: dict[str, Any]) -> None:
        wanted = kinds.metadata_of(proposed).get("resourceVersion")
        metadata = kinds.metadata_of(current)
        if wanted not in (None, "") and str(wanted) != metadata.get("resourceVersion"):
            raise Conflict(
                f'Operation cannot be fulfilled on {resource} "{metadata.get("name")}": '
                "the object has been modified; please apply your changes to the latest version "
                "and try again"
            )

    def delete(
        self, resource: str, namespace: str, name: str, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Delete, gracefully for bound Pods: see docs/sim-apiserver.md for the rules."""
        options = options or {}
        key = self._key(resource, namespace, name)
        current = self._objects[resource].get(key)
        if current is None:
            raise not_found(resource, name)
        _check_preconditions(resource, current, options.get("preconditions"))
        if resource != "pods" or not kinds.well_formed(current):
            return clone(self._commit(resource, key, DELETED, None).obj)
        requested = options.get("gracePeriodSeconds")
        if requested is not None and not isinstance(requested, int):
            raise BadRequest("gracePeriodSeconds must be an integer")
        return clone(self._delete_pod(key, current, requested))

    def _delete_pod(self, key: Key, pod: dict[str, Any], requested: int | None) -> dict[str, Any]:
        grace = kinds.grace_seconds(pod, requested)
        metadata = kinds.metadata_of(pod)
        pending = metadata.get("deletionGracePeriodSeconds")
        pending = pending if isinstance(pending, int) else None
        if pending and grace >= pending:
            # Already terminating; only a shorter grace period changes anything.
            return pod
        if grace > 0:
            return self._commit("pods", key, MODIFIED, self._terminating(pod, grace, pending)).obj
        final = kinds.mark_terminating(pod, 0, self.clock())
        if pending:
            kinds.metadata_of(final)["deletionTimestamp"] = metadata["deletionTimestamp"]
        return self._commit("pods", key, DELETED, final).obj

    def _terminating(self, pod: dict[str, Any], grace: int, pending: int | None) -> dict[str, Any]:
        terminating = kinds.mark_terminating(pod, grace, self.clock())
        due = pod["metadata"].get("deletionTimestamp")
        if pending and isinstance(due, str):
            # Shortening keeps the original start of the countdown, as the real server does.
            terminating["metadata"]["deletionTimestamp"] = kinds.timestamp(
                kinds.parse_timestamp(due) - timedelta(seconds=pending - grace)
            )
        return terminating

    def inject(
        self, resource: str, obj: Any, event_type: str = ADDED, *, key: Key | None = None
    ) -> Any:
        """Store `obj` as given, bypassing defaults and validation (for malformed-input tests).

        The object is keyed by `key` (namespace, name) when given, else by its own namespace and
        name, else by a placeholder; an object without a name needs `key` to be changed later.
        """
        if event_type not in (ADDED, MODIFIED, DELETED):
            raise ValueError(f"unknown event type {event_type!r}")
        obj = clone(obj)
        key = key or self._raw_key(obj)
        if event_type == DELETED:
            if key not in self._objects[resource]:
                raise not_found(resource, key[1])
            return self._commit(resource, key, DELETED, obj).obj
        return self._commit(resource, key, event_type, obj).obj

    def _raw_key(self, obj: Any) -> Key:
        metadata = kinds.metadata_of(obj)
        name, namespace = metadata.get("name"), metadata.get("namespace")
        return (
            namespace if isinstance(namespace, str) else "",
            name if isinstance(name, str) else f"<raw-{self._rv + 1}>",
        )

    def compact(self) -> int:
        """Drop the whole watch history: a watch from any earlier resourceVersion gets 410."""
        self._history.clear()
        self._compacted = self._rv
        return self._compacted

    def _commit(self, resource: str, key: Key, event_type: str, obj: Any) -> Change:
        self._rv += 1
        table = self._objects[resource]
        prev = table.get(key)
        if event_type == DELETED:
            # The final object is the stored one unless the caller supplies what it became.
            table.pop(key)
            obj = _with_rv(prev if obj is None else obj, self._rv)
        else:
            obj = _with_rv(obj, self._rv)
            table[key] = obj
        change = Change(self._rv, resource, key[0], event_type, obj, prev)
        self._history.append(change)
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        for listener in list(self._listeners):
            listener(change)
        return change

    def _key(self, resource: str, namespace: str, name: str) -> Key:
        return (namespace if kinds.KINDS[resource].namespaced else "", name)


def _check_preconditions(resource: str, current: dict[str, Any], preconditions: Any) -> None:
    if not isinstance(preconditions, dict):
        return
    metadata = kinds.metadata_of(current)
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = preconditions.get(field)
        if wanted is not None and wanted != metadata.get(field):
            raise Conflict(
                f"Precondition failed: {label} in precondition: {wanted}, "
                f"{label} in object meta: {metadata.get(field)}",
                details={"name": metadata.get("name"), "kind": resource},
            )
