"""Request/reply bodies of the micro services: claims.query, pods.get, pods.pending, reclaim.now."""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas.documents import Claim, PodRecord
from schemas.pods import PodState
from schemas.version import CURRENT


class PodsGet(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="PodsGet"):
    v: int = CURRENT
    uid: str
    fresh: bool = False


class PodsGetReply(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="PodsGetReply"):
    v: int = CURRENT
    uid: str
    state: PodState
    evidence: str
    resource_version: str = ""
    pod: PodRecord | None = None


PODS_STATES_MAX = 1000  # UIDs per pods.states request; a longer list is refused as malformed


class PodsStates(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="PodsStates"):
    """`pods.get` for many Pods in one round trip, from the watcher's view (never `fresh`).

    Added after `PodsGet`: a watcher that predates it has no responder on `pods.states`, and the
    asker then falls back to one `PodsGet` per Pod.
    """

    v: int = CURRENT
    uids: Annotated[list[str], msgspec.Meta(max_length=PODS_STATES_MAX)]


class PodsStatesReply(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="PodsStatesReply"
):
    """One `PodsGetReply` per asked UID, in the order asked, each without its `pod` record."""

    v: int = CURRENT
    pods: list[PodsGetReply] = []


class PendingPodsQuery(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="PendingPodsQuery"
):
    """Pending Pods on this node whose containers request `resource` in `quantity`."""

    v: int = CURRENT
    resource: str
    quantity: int
    fresh: bool = False


class PendingPodsReply(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="PendingPodsReply"
):
    v: int = CURRENT
    pods: list[PodRecord] = []  # oldest first by (created, namespace, name)
    resource_version: str = ""


class ClaimsQuery(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="ClaimsQuery"):
    """The claims of one Pod, or of the whole node when `pod_uid` is empty."""

    v: int = CURRENT
    pod_uid: str = ""


class ClaimsReply(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="ClaimsReply"):
    v: int = CURRENT
    claims: list[Claim] = []
    revisions: dict[str, int] = {}  # card index (as str) -> KV revision the claims were read at


class ReclaimNow(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="ReclaimNow"):
    v: int = CURRENT
    claim_ids: list[str]
    reason: str = ""


class ReclaimOutcome(msgspec.Struct, frozen=True, kw_only=True):
    claim_id: str
    done: bool
    reason: str


class ReclaimNowReply(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="ReclaimNowReply"
):
    v: int = CURRENT
    outcomes: list[ReclaimOutcome] = []
