"""What event, if any, one observation of a Pod produces, given the persisted view of that Pod.

Pure: a function of (record, observation, now), deterministic, no I/O. The shell publishes the
event and then writes the record; a crash between the two replays the same decision, and the
event's msg id (which names the fact) makes the replay a duplicate the stream drops.

Rules, in the order they are checked:
- a `gone` record is final: nothing changes it (a tombstone answers late and reordered input);
- a DELETED watch event is evidence of death whatever its order;
- a Pod absent from a LIST is gone only when the LIST is at a newer resourceVersion than the
  version the record was last seen at (a stale LIST proves nothing);
- a GET that finds nothing (404), or another UID under the name, is evidence of death;
- a version no newer than the record's is stale and ignored;
- `finished` (Succeeded/Failed) never returns to `live`;
- a live Pod is re-announced (PodSeen) only when a field partkeeper cares about changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from schemas import PodEvent, PodFinished, PodGone, PodRecord, PodSeen
from schemas.events import GoneEvidence
from schemas.names import encode_token
from schemas.pods import PodState
from schemas.version import CURRENT
from services.watcher.pods import PodFacts, parse_rv


@dataclass(frozen=True, slots=True)
class Seen:
    """The Pod exists at this version (a watch ADDED/MODIFIED, a LIST item, a GET)."""

    pod: PodFacts
    source: str  # "watch MODIFIED", "list", "get": for the evidence text


@dataclass(frozen=True, slots=True)
class Deleted:
    """A DELETED watch event carrying the Pod's final version."""

    pod: PodFacts


@dataclass(frozen=True, slots=True)
class Absent:
    """The API server answered without this UID: a LIST lacking it, a GET 404, another UID.

    `resource_version` is the version the answer rests on (the LIST's, the other Pod's); empty
    for a 404, which carries none.
    """

    uid: str
    evidence: GoneEvidence
    resource_version: str
    detail: str


Observation = Seen | Deleted | Absent


@dataclass(frozen=True, slots=True)
class Decision:
    event: PodEvent | None  # publish this first, when set
    record: PodRecord | None  # then write this; None: nothing changes
    reason: str  # one sentence for the decision log


def observation_uid(observation: Observation) -> str:
    return observation.uid if isinstance(observation, Absent) else observation.pod.uid


def msg_id(event: PodEvent) -> str:
    """The de-duplication id naming the fact (docs/protocol.md), scoped by the node's token:
    the server de-duplicates across the whole stream, so an id naming only the Pod would let
    one node's event drop another node's about the same uid."""
    node = encode_token(event.node)
    if isinstance(event, PodSeen):
        return f"{node}/PodSeen/{event.uid}/{event.resource_version}"
    return f"{node}/{type(event).__name__}/{event.uid}"


def decide(node: str, record: PodRecord | None, observation: Observation, now: float) -> Decision:
    if record is not None and record.state == "gone":
        return Decision(None, None, f"already gone ({record.evidence}); tombstone kept")
    if isinstance(observation, Deleted):
        return _gone_by_delete(node, record, observation.pod, now)
    if isinstance(observation, Absent):
        return _absent(node, record, observation, now)
    return _seen(node, record, observation, now)


def _gone_by_delete(node: str, record: PodRecord | None, pod: PodFacts, now: float) -> Decision:
    evidence = f"DELETED watch event at resourceVersion {pod.resource_version}"
    base = _record_from(node, pod, "gone", evidence, now)
    gone = _tombstone(base if record is None else record, "deleted", pod.resource_version,
                      evidence, now)
    return Decision(_gone_event(gone, now), gone, f"gone: {evidence}")


def _absent(node: str, record: PodRecord | None, seen: Absent, now: float) -> Decision:
    if record is None:
        return Decision(None, None, "absent but never seen: absence is not evidence")
    if seen.evidence == "relist":
        try:
            newer = parse_rv(seen.resource_version) > parse_rv(record.resource_version)
        except ValueError as exc:
            return Decision(None, None, f"cannot order the LIST against the record: {exc}")
        if not newer:
            return Decision(
                None, None,
                f"absent from a LIST at resourceVersion {seen.resource_version}, not newer than "
                f"{record.resource_version} where it was seen: stale, not evidence",
            )
    resource_version = seen.resource_version or record.resource_version
    gone = _tombstone(record, seen.evidence, resource_version, seen.detail, now)
    return Decision(_gone_event(gone, now), gone, f"gone: {seen.detail}")


def _seen(node: str, record: PodRecord | None, seen: Seen, now: float) -> Decision:
    pod = seen.pod
    evidence = f"{seen.source} at resourceVersion {pod.resource_version}"
    state: PodState = "finished" if pod.terminal else "live"
    if record is None:
        new = _record_from(node, pod, state, evidence, now)
        return Decision(_seen_event(new, now), new, f"first seen {state}: {evidence}")
    if pod.rv <= _rv_or_zero(record.resource_version):
        return Decision(None, None, f"stale: {evidence}, record at {record.resource_version}")
    if record.state == "finished":
        # Only death changes a finished Pod; its later versions matter to nobody.
        return Decision(None, None, f"already finished; {evidence} changes nothing")
    if not pod.terminal and _same_relevant(record, pod):
        return Decision(None, None, f"no relevant change: {evidence}")
    new = _record_from(node, pod, state, evidence, now)
    return Decision(_seen_event(new, now), new, f"{state}: {evidence}")


def _rv_or_zero(text: str) -> int:
    try:
        return parse_rv(text)
    except ValueError:
        return 0


def _same_relevant(record: PodRecord, pod: PodFacts) -> bool:
    return (
        record.phase == pod.phase
        and record.deleting == pod.deleting
        and tuple(record.containers) == pod.containers
    )


def _record_from(
    node: str, pod: PodFacts, state: PodState, evidence: str, now: float
) -> PodRecord:
    return PodRecord(
        node=node,
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        phase=pod.phase,
        state=state,
        deleting=pod.deleting,
        created=pod.created,
        containers=list(pod.containers),
        resource_version=pod.resource_version,
        evidence=evidence,
        updated_at=now,
    )


def _tombstone(
    record: PodRecord, evidence: GoneEvidence, resource_version: str, detail: str, now: float
) -> PodRecord:
    """The record, gone: what the Pod was stays, written in the current version."""
    return msgspec.structs.replace(
        record, v=CURRENT, state="gone", containers=list(record.containers),
        resource_version=resource_version, evidence=detail, gone_evidence=evidence, updated_at=now,
    )


def _event_fields(record: PodRecord, now: float) -> dict[str, Any]:
    """The fields every Pod event carries."""
    return {
        "node": record.node,
        "uid": record.uid,
        "namespace": record.namespace,
        "name": record.name,
        "resource_version": record.resource_version,
        "observed_at": now,
    }


def _seen_event(record: PodRecord, now: float) -> PodEvent:
    common = _event_fields(record, now)
    if record.state == "finished":
        return PodFinished(phase=record.phase, **common)
    return PodSeen(
        phase=record.phase,
        deleting=record.deleting,
        created=record.created,
        containers=list(record.containers),
        **common,
    )


def _gone_event(record: PodRecord, now: float) -> PodGone:
    assert record.gone_evidence is not None
    return PodGone(evidence=record.gone_evidence, **_event_fields(record, now))
