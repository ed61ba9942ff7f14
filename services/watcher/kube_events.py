"""Which Kubernetes Event an entry of the partition audit log becomes, and under which name (pure).

| audit event | Kubernetes Event |
|---|---|
| `ClaimChanged` to `active` | `PartitionAllocated` (Normal) |
| `ClaimChanged` to `removed`, with the instance it had | `PartitionReclaimed` (Normal) |
| `DestroyFailed` | `ReclaimBlocked` (Warning); for a lost card, the claim abandoned |
| `AllocateRefused` naming a Pod | `AllocateRefused` (Warning) |
| `CardUnhealthy` | `PartitionCardUnhealthy` (Warning) |
| anything else | none |

A removal without an instance is not a reclaim: it is the allocator undoing a claim it never
activated (or a crash before anything was created), so the Pod never held that partition.

Who may say it: an entry becomes an Event only from the subject of the service that publishes
that kind (`scope_of`): `AllocateRefused` and `CardUnhealthy` on the node scope, which only the
allocator may publish (the GC has its own subject, the reclaimer is denied it), claim
transitions and destroy failures on their own card's subject. And only about a Pod the watcher's
own view holds on this node (recorder.py).

The Event's name is derived from the fact it records, not from the delivery, so the same audit
entry delivered or published twice names the same Event and the second create is refused by
the API server as already existing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from schemas import AllocateRefused, CardUnhealthy, ClaimChanged, DestroyFailed, PartitionEvent
from schemas.documents import SLICE_PROFILE
from schemas.names import NODE_SCOPE, card_token
from schemas.pods import InvalidPodUID, validate_pod_uid

EventType = Literal["Normal", "Warning"]
NAME_LIMIT = 253
_HASH_CHARS = 16
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class Note:
    """A Kubernetes Event to record: its reason, type and message, and the fact it records."""

    reason: str
    type: EventType
    message: str
    fact: str


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str


class BadTarget(ValueError):
    """The audit event names its Pod with values that cannot be a Pod's."""


def describe(event: PartitionEvent) -> Note | None:
    """The Event `event` becomes, or None when it is not one a Pod's owner needs to see."""
    if isinstance(event, ClaimChanged):
        return _claim_changed(event)
    if isinstance(event, DestroyFailed) and event.reason == "card_lost":
        return Note(
            "ReclaimBlocked", "Warning",
            f"Cannot destroy MIG partition {event.instance_uuid or '(never created)'} on card "
            f"{event.card} (claim {event.claim_id}): the card is lost (it stopped answering) "
            f"after {event.attempts} attempt(s): {event.message}; the claim is abandoned, since "
            "a lost card keeps no partition once it is reset",
            f"DestroyFailed/{event.claim_id}/{event.attempts}",
        )
    if isinstance(event, DestroyFailed):
        return Note(
            "ReclaimBlocked", "Warning",
            f"Cannot destroy MIG partition {event.instance_uuid} on card {event.card} (claim "
            f"{event.claim_id}): {_words(event.reason)} after {event.attempts} attempt(s): "
            f"{event.message}; the reclaimer keeps retrying and the slot stays occupied",
            f"DestroyFailed/{event.claim_id}/{event.attempts}",
        )
    if isinstance(event, AllocateRefused) and event.pod_uid:
        devices = ",".join(sorted(event.device_ids))
        return Note(
            "AllocateRefused", "Warning",
            f"Allocate of {len(event.device_ids)} {event.resource} refused: {event.reason}",
            f"AllocateRefused/{event.pod_uid}/{event.resource}/{devices}/{event.reason}",
        )
    if isinstance(event, CardUnhealthy):
        return _card_unhealthy(event)
    return None


def _card_unhealthy(event: CardUnhealthy) -> Note:
    what = (f"its MIG partition {event.instance_uuid} on card {event.card}"
            if event.scope == "instance" else f"card {event.card}, which holds its partition,")
    said = f"XID {event.xid}" if event.xid else event.cause
    return Note(
        "PartitionCardUnhealthy", "Warning",
        f"{what[0].upper()}{what[1:]} failed ({said}: {event.meaning}; claim {event.claim_id}); "
        "no new partition is placed there until it recovers, and this Pod's partition is left "
        "as it is",
        f"CardUnhealthy/{event.claim_id}/{event.card}/{event.cause}/{event.at:.3f}",
    )


def scope_of(event: PartitionEvent) -> str | None:
    """The last token of the subject an entry that becomes an Event must come on (None: it
    becomes none): the card's own for claim transitions and destroy failures (the allocator's
    and the reclaimer's), the node scope for refusals (the allocator's alone)."""
    if isinstance(event, ClaimChanged | DestroyFailed):
        return card_token(event.card)
    if isinstance(event, AllocateRefused | CardUnhealthy):
        return NODE_SCOPE
    return None


def _claim_changed(event: ClaimChanged) -> Note | None:
    what = _partition(event)
    if event.state == "active":
        return Note(
            "PartitionAllocated", "Normal",
            f"Allocated {what} to container {event.container} (claim {event.claim_id})",
            f"ClaimChanged/{event.claim_id}/active",
        )
    if event.state == "removed" and event.instance_uuid:
        why = f": {event.reason}" if event.reason else ""
        return Note(
            "PartitionReclaimed", "Normal",
            f"Reclaimed {what} of container {event.container} (claim {event.claim_id}){why}",
            f"ClaimChanged/{event.claim_id}/removed",
        )
    return None


def _partition(event: ClaimChanged) -> str:
    if event.profile == SLICE_PROFILE:
        return f"logical slice {event.start} on card {event.card}"
    uuid = f" ({event.instance_uuid})" if event.instance_uuid else ""
    return (f"MIG partition {event.profile} on card {event.card} at placement "
            f"{event.start}+{event.size}{uuid}")


def _words(kind: str) -> str:
    return kind.replace("_", " ") or "failed"


def pod_uid_of(event: PartitionEvent) -> str:
    """The Pod the event is about ("" when none)."""
    return getattr(event, "pod_uid", "") or ""


def named_pod(event: PartitionEvent) -> PodRef | None:
    """The Pod as the event itself names it, or None when it lacks the namespace or name.

    Raises BadTarget for a UID, namespace or name no Pod can have (invariant 10).
    """
    uid = pod_uid_of(event)
    try:
        validate_pod_uid(uid)
    except InvalidPodUID as exc:
        raise BadTarget(f"{type(event).__name__} names no valid Pod: {exc}") from exc
    namespace = getattr(event, "namespace", "") or ""
    name = getattr(event, "name", "") or ""
    if not namespace or not name:
        return None
    check_pod(PodRef(namespace, name, uid))
    return PodRef(namespace, name, uid)


def check_pod(pod: PodRef) -> None:
    """Raise BadTarget unless the namespace is a DNS label and the name a DNS subdomain."""
    if len(pod.namespace) > 63 or not _DNS_LABEL.fullmatch(pod.namespace):
        raise BadTarget(f"Pod {pod.uid}: namespace {pod.namespace[:80]!r} is not a DNS label")
    if len(pod.name) > NAME_LIMIT or not _DNS_SUBDOMAIN.fullmatch(pod.name):
        raise BadTarget(f"Pod {pod.uid}: name {pod.name[:80]!r} is not a DNS subdomain")


def event_name(pod_name: str, fact: str) -> str:
    """`<pod name>.<16 hex of the fact's hash>`: stable for a fact, a valid object name."""
    digest = hashlib.sha256(fact.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    prefix = pod_name[: NAME_LIMIT - _HASH_CHARS - 1].rstrip(".-")
    return f"{prefix}.{digest}" if prefix else digest
