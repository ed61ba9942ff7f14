"""Events on the durable streams: Pod events (PK_PODS), the partition audit log (PK_PARTITIONS)."""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.pods import ContainerRequest, PodPhase
from schemas.version import CURRENT

GoneEvidence = Literal["deleted", "relist", "get-404", "get-other-uid"]
ClaimState = Literal["creating", "active", "releasing", "removed"]


class _PodEventBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    v: int = CURRENT
    node: str
    uid: str
    namespace: str
    name: str
    resource_version: str
    observed_at: float


class PodSeen(_PodEventBase, frozen=True, tag="PodSeen"):
    """A Pod on this node appeared or changed in a field partkeeper cares about."""

    phase: PodPhase
    deleting: bool = False
    created: str = ""
    containers: list[ContainerRequest] = []


class PodFinished(_PodEventBase, frozen=True, tag="PodFinished"):
    """A Pod reached a terminal phase; its containers no longer run."""

    phase: PodPhase


class PodGone(_PodEventBase, frozen=True, tag="PodGone"):
    """The API server confirmed the Pod no longer exists, with the evidence."""

    evidence: GoneEvidence


PodEvent = PodSeen | PodFinished | PodGone


class _PartitionEventBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    v: int = CURRENT
    node: str
    at: float


class ClaimChanged(_PartitionEventBase, frozen=True, tag="ClaimChanged"):
    """A claim moved to `state` (removed: the claim is gone from the store)."""

    card: int
    claim_id: str
    pod_uid: str
    namespace: str
    name: str
    container: str
    profile: str
    start: int
    size: int
    state: ClaimState
    instance_uuid: str | None = None
    reason: str = ""


class DestroyFailed(_PartitionEventBase, frozen=True, tag="DestroyFailed"):
    card: int
    claim_id: str
    pod_uid: str
    instance_uuid: str
    reason: str  # the driver error kind: in_use, unknown, ...
    message: str
    attempts: int


class ForeignFound(_PartitionEventBase, frozen=True, tag="ForeignFound"):
    """A physical instance that no claim describes: counted occupied, never destroyed by default."""

    card: int
    instance_uuid: str
    profile: str
    start: int
    size: int


class ForeignGone(_PartitionEventBase, frozen=True, tag="ForeignGone"):
    card: int
    instance_uuid: str
    reaped: bool


class WorkdirCollected(_PartitionEventBase, frozen=True, tag="WorkdirCollected"):
    pod_uid: str
    removed: list[str] = []


class AllocateRefused(_PartitionEventBase, frozen=True, tag="AllocateRefused"):
    """The allocator refused an Allocate; `reason` is the sentence kubelet was given."""

    resource: str
    device_ids: list[str]
    reason: str
    pod_uid: str = ""  # empty when the Pod could not be identified
    namespace: str = ""
    name: str = ""


class CardUnhealthy(_PartitionEventBase, frozen=True, tag="CardUnhealthy"):
    """A Pod's partition is on a card that failed (or is itself the partition that failed):
    published by the allocator on its node-wide subject, one per Pod, and recorded by the watcher
    as a `PartitionCardUnhealthy` Warning Event. Added within version 1: a reader that predates
    it refuses the unknown type and dead-letters the entry, changing nothing (docs/contract.md).
    """

    card: int
    cause: str  # the metric label: `xid-48`, `ecc`, `lost`
    meaning: str  # what the fault means, in a sentence
    claim_id: str
    pod_uid: str
    namespace: str
    name: str
    xid: int = 0  # 0 when the fault was not an XID (an ECC error)
    scope: Literal["card", "instance"] = "card"
    instance_uuid: str = ""


class CardHealthChanged(_PartitionEventBase, frozen=True, tag="CardHealthChanged"):
    """A card's health as the allocator's card watch folded it, on every change (its node-wide
    subject): the watcher notes it on its Node (`partkeeper.io/card-<index>-health`). Added
    within version 1, as CardUnhealthy."""

    card: int
    health: Literal["ok", "failed", "lost"]
    cause: str = ""  # the metric label of the fault that failed it first ("" once ok)
    meaning: str = ""


PartitionEvent = (
    ClaimChanged | DestroyFailed | ForeignFound | ForeignGone | WorkdirCollected | AllocateRefused
    | CardUnhealthy | CardHealthChanged
)
