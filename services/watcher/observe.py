"""Turning what the API server answered (a watch event, a LIST, a GET) into observations.

Pure: the answers arrive as plain JSON values. Each function returns the observations to apply
and the objects it skipped (with the reason), never guessing: a malformed object is skipped; a
LIST that cannot be trusted to be complete declares nobody absent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas import PodRecord
from schemas.pods import is_pod_uid
from services.watcher.decide import Absent, Deleted, Observation, Seen
from services.watcher.pods import MalformedPod, Resources, identity, parse_pod, parse_rv

WATCHED_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED"})


@dataclass(frozen=True, slots=True)
class Listing:
    """One LIST response: its items as JSON values and its resourceVersion."""

    items: list[Any]
    resource_version: str


@dataclass(frozen=True, slots=True)
class Readings:
    observations: list[Observation] = field(default_factory=list)
    skipped: list[MalformedPod] = field(default_factory=list)
    # Why no Pod was declared absent from this LIST, when that part was withheld.
    absence_withheld: str | None = None


@dataclass(frozen=True, slots=True)
class NotFound:
    """A GET answered 404 for the namespace/name."""


def from_watch(event: Any, *, node: str, resources: Resources) -> Readings:
    """A watch event (ADDED, MODIFIED, DELETED) as one observation, or a skip."""
    kind = event.get("type") if isinstance(event, dict) else None
    if kind not in WATCHED_TYPES:
        return Readings(skipped=[MalformedPod(f"watch event of unknown type {kind!r}")])
    try:
        pod = parse_pod(event.get("object"), node=node, resources=resources)
    except MalformedPod as exc:
        return Readings(skipped=[exc])
    observation: Observation = Deleted(pod) if kind == "DELETED" else Seen(pod, f"watch {kind}")
    return Readings(observations=[observation])


def from_list(
    records: Iterable[PodRecord], listing: Listing, *, node: str, resources: Resources
) -> Readings:
    """Every readable item is Seen; a known Pod the LIST lacks is Absent (decide() checks that
    the LIST is newer than the record).

    An item that is malformed but names a namespace/name shields the records of that name: it
    may be our Pod with a damaged field. An item naming nothing shields every record: the LIST
    cannot be shown complete for anyone.
    """
    observations: list[Observation] = []
    skipped: list[MalformedPod] = []
    listed: set[str] = set()
    shielded: set[tuple[str, str]] = set()
    withheld: str | None = None
    try:
        parse_rv(listing.resource_version)
    except ValueError as exc:
        withheld = f"the LIST's {exc}"
    for item in listing.items:
        try:
            pod = parse_pod(item, node=node, resources=resources)
        except MalformedPod as exc:
            skipped.append(exc)
            ids = identity(item)
            if ids is None:
                withheld = withheld or "the LIST holds an object without namespace and name"
            else:
                shielded.add(ids)
            continue
        listed.add(pod.uid)
        observations.append(Seen(pod, "list"))
    if withheld is None:
        observations.extend(_absences(records, listing.resource_version, listed, shielded))
    return Readings(observations, skipped, withheld)


def _absences(
    records: Iterable[PodRecord], rv: str, listed: set[str], shielded: set[tuple[str, str]]
) -> list[Observation]:
    out: list[Observation] = []
    for record in records:
        if record.state == "gone" or record.uid in listed:
            continue
        if (record.namespace, record.name) in shielded:
            continue
        detail = (
            f"absent from the node's LIST at resourceVersion {rv}; last seen at "
            f"{record.resource_version}"
        )
        out.append(Absent(record.uid, "relist", rv, detail))
    return out


def from_get(
    record: PodRecord, answer: NotFound | Any, *, node: str, resources: Resources
) -> Readings:
    """A GET of the record's namespace/name: Seen, Absent (404 or another UID), or a skip."""
    where = f"{record.namespace}/{record.name}"
    if isinstance(answer, NotFound):
        detail = f"GET {where} returned 404"
        return Readings(observations=[Absent(record.uid, "get-404", "", detail)])
    metadata = answer.get("metadata") if isinstance(answer, dict) else None
    other = metadata.get("uid") if isinstance(metadata, dict) else None
    # Only a well-formed other UID is evidence; an odd one is a malformed object, skipped below.
    if is_pod_uid(other) and other != record.uid and isinstance(metadata, dict):
        rv = metadata.get("resourceVersion")
        rv_text = rv if isinstance(rv, str) else ""
        detail = f"GET {where} returned another Pod, uid {other!r} at resourceVersion {rv_text}"
        return Readings(observations=[Absent(record.uid, "get-other-uid", rv_text, detail)])
    try:
        pod = parse_pod(answer, node=node, resources=resources)
    except MalformedPod as exc:
        return Readings(skipped=[exc])
    return Readings(observations=[Seen(pod, "get")])
