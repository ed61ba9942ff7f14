"""Events are stored once, in the core v1 shape, and shown through two APIs.

The real server keeps one Event object and serves it as core `v1` and as `events.k8s.io/v1`
with renamed fields; doing the same here means an Event posted through either API is listed by
both, so a test need not know which API the code under test used.
"""

from __future__ import annotations

from typing import Any

from .clone import clone

EVENTS_API = "events.k8s.io/v1"

# events.k8s.io/v1 field -> core v1 field.
_RENAMED = {
    "regarding": "involvedObject",
    "note": "message",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
    "reportingController": "reportingComponent",
}
_SHARED = (
    "metadata",
    "eventTime",
    "series",
    "reportingInstance",
    "action",
    "reason",
    "related",
    "type",
)


def to_core(event: dict[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event in the core v1 shape the store keeps."""
    core: dict[str, Any] = {"kind": "Event", "apiVersion": "v1"}
    for field in _SHARED:
        if field in event:
            core[field] = clone(event[field])
    for new, old in _RENAMED.items():
        if field_value := event.get(new):
            core[old] = clone(field_value)
    return core


def from_core(core: dict[str, Any]) -> dict[str, Any]:
    """A stored core v1 Event as events.k8s.io/v1 shows it."""
    event: dict[str, Any] = {"kind": "Event", "apiVersion": EVENTS_API}
    for field in _SHARED:
        if field in core:
            event[field] = clone(core[field])
    for new, old in _RENAMED.items():
        if old in core:
            event[new] = clone(core[old])
    source = found if isinstance(found := core.get("source"), dict) else {}
    event.setdefault("reportingController", source.get("component", ""))
    event.setdefault("reportingInstance", source.get("host", ""))
    if not event.get("eventTime"):
        # The real server shows null here for Events posted through core v1, which the
        # client's EventsV1Event model refuses; the creation time keeps such Events listable.
        metadata = found if isinstance(found := core.get("metadata"), dict) else {}
        created = str(metadata.get("creationTimestamp", "1970-01-01T00:00:00Z"))
        event["eventTime"] = created.replace("Z", ".000000Z")
    return event


def core_field_selector(selector: str | None) -> str | None:
    """events.k8s.io field names mapped onto the core fields the store selects on."""
    if not selector:
        return selector
    terms = []
    for term in selector.split(","):
        for new, old in _RENAMED.items():
            if term.startswith(f"{new}.") or term.split("=")[0].rstrip("!") == new:
                term = old + term[len(new) :]
                break
        terms.append(term)
    return ",".join(terms)
