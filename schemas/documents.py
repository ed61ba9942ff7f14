"""KV documents: claims per card (pk-claims), the watcher's Pod view (pk-pods), capacity."""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.events import ClaimChanged, ClaimState, GoneEvidence
from schemas.pods import ContainerRequest, PodPhase, PodState
from schemas.version import CURRENT

ClaimKind = Literal["partition", "slice"]
# The profile of every claim of kind "slice": a logical slice of a card not in partition mode.
SLICE_PROFILE = "sliced"


class LiveInstance(msgspec.Struct, frozen=True, kw_only=True):
    """The identity the driver reported once the partition existed."""

    gi_id: int
    ci_id: int
    uuid: str


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """Ownership of one partition (or one logical slice) by one container of one Pod.

    Written as `creating` before the driver is asked to create anything (write-ahead). The spec
    (card, profile, start, size) says what the partition should be; `instance` is filled only once
    the hardware exists.
    """

    id: str
    kind: ClaimKind = "partition"
    state: ClaimState
    pod_uid: str
    namespace: str
    name: str
    container: str
    resource: str
    device_ids: list[str]
    card: int
    profile: str
    start: int
    size: int
    instance: LiveInstance | None = None
    created_at: float
    updated_at: float
    release_reason: str = ""
    release_attempts: int = 0
    # DRA mode: the ResourceClaim this partition was prepared for ("<namespace>/<name>", UID).
    resource_claim: str = ""
    resource_claim_uid: str = ""
    # DRA mode: when kubelet last called NodeUnprepareResources for the ResourceClaim (0: it is
    # prepared). The partition lives until then, and until the claim is deallocated from this
    # node, or deleted (docs/contract.md section 11). Older records lack it: 0, still prepared.
    unprepared_at: float = 0.0
    # A host reboot (docs/operations.md, "After a reboot"). `rebooted`: the boot that made this
    # claim's partition has ended, so the partition is gone; the claim is kept for its Pod and
    # re-made when kubelet starts the container again, and counts nothing occupied until then.
    # `remakes`: how many times it was re-made (its audit entries' ids carry it). Older records
    # lack both: not rebooted, never re-made.
    rebooted: bool = False
    remakes: int = 0


class Unpublished(msgspec.Struct, frozen=True, kw_only=True):
    """A claim transition written in this document whose audit event may not be on PK_PARTITIONS
    yet: written with the transition (the same compare-and-set), removed once published. It is
    re-sent with the same `Nats-Msg-Id`, so the stream's duplicate window keeps it once."""

    msg_id: str
    event: ClaimChanged


class CardClaims(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="CardClaims"):
    """Every claim on one card. The KV revision of this document fences all writers of the card.

    `outbox` (added after version 1 documents were first written; absent there, read as empty)
    holds the transitions not yet known to be on the audit log (claims/outbox.py); `boot_id`
    (added the same way) the boot its claims' partitions belong to."""

    v: int = CURRENT
    node: str
    card: int
    claims: dict[str, Claim] = {}
    outbox: list[Unpublished] = []
    # The host's boot id (`PK_PROC_ROOT/sys/kernel/random/boot_id`) the partitions of this card's
    # claims were made in; a service that starts under another one marks them `rebooted`
    # (claims/machine.after_boot). Added in place like `outbox`: "" in older documents, read as
    # "not known yet" and set, changing nothing else, at the next start.
    boot_id: str = ""


class PodRecord(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="PodRecord"):
    """The watcher's view of one Pod, persisted so a restart neither re-announces nor forgets."""

    v: int = CURRENT
    node: str
    uid: str
    namespace: str
    name: str
    phase: PodPhase
    state: PodState
    deleting: bool = False
    created: str = ""
    containers: list[ContainerRequest] = []
    resource_version: str
    evidence: str = ""
    gone_evidence: GoneEvidence | None = None
    updated_at: float


class ResourceCapacity(msgspec.Struct, frozen=True, kw_only=True):
    total: int
    healthy: int
    unhealthy: int
    free: int


class InstanceView(msgspec.Struct, frozen=True, kw_only=True):
    """A physical instance as the allocator last enumerated it, with the claim that owns it."""

    uuid: str
    profile: str
    start: int
    size: int
    gi_id: int
    foreign: bool
    claim_id: str | None = None


class CardView(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    model: str
    mode: Literal["partition", "sliced"]
    instances: list[InstanceView] = []
    free: dict[str, int] = {}  # profile (or "sliced") -> instances placeable now
    pending_reclaims: int = 0  # claims releasing, or held by Pods confirmed gone/finished
    # Card health (docs/operations.md, "A failed card"): "ok", "failed" (a fatal XID or ECC
    # error) or "lost" (it stopped answering); `cause` is the metric label (`xid-48`, `lost`)
    # and `meaning` what it means. Added in place: an older reader ignores them.
    health: Literal["ok", "failed", "lost"] = "ok"
    cause: str = ""
    meaning: str = ""
    failed_instances: list[str] = []  # UUIDs of partitions that failed by themselves


class SliceLimiterView(msgspec.Struct, frozen=True, kw_only=True):
    """Who enforces the node's logical slices (`PK_SLICE_LIMITER`), as the allocator found it."""

    name: str  # "none" or "hami-core"
    enforced: bool  # a limiter is configured and its files were present at start
    dir: str = ""  # the host dir of its files
    missing: list[str] = []


class NodeCapacity(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="NodeCapacity"):
    """What the allocator advertises per resource, and its view of every card (for status)."""

    v: int = CURRENT
    node: str
    at: float
    resources: dict[str, ResourceCapacity] = {}
    free_per_card: dict[str, dict[str, int]] = {}
    cards: list[CardView] = []
    # None: written by an allocator from before the limiter was reported (read as unknown).
    slice_limiter: SliceLimiterView | None = None
    # The mode the allocator runs in ("deviceplugin" or "dra"); "" from an allocator before it
    # was reported. Claims of the other mode are adopted (docs/operations.md).
    allocator_mode: str = ""
