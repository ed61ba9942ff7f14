"""The wire contract: events, request/reply bodies, KV documents, subjects and stream configs.

Imports nothing of ours. Every message is a msgspec struct encoded as JSON with `v` (schema
version) and a `type` tag. Decode with the functions in `schemas.codec`, which raise
`SchemaError` for anything unknown or malformed.
"""

from schemas.codec import SchemaError, decode, decode_request, encode
from schemas.documents import CardClaims, Claim, LiveInstance, NodeCapacity, PodRecord
from schemas.events import (
    AllocateRefused,
    CardHealthChanged,
    CardUnhealthy,
    ClaimChanged,
    DestroyFailed,
    ForeignFound,
    ForeignGone,
    PartitionEvent,
    PodEvent,
    PodFinished,
    PodGone,
    PodSeen,
    WorkdirCollected,
)
from schemas.pods import ContainerRequest, validate_pod_uid
from schemas.rpc import (
    ClaimsQuery,
    ClaimsReply,
    PendingPodsQuery,
    PendingPodsReply,
    PodsGet,
    PodsGetReply,
    PodsStates,
    PodsStatesReply,
    ReclaimNow,
    ReclaimNowReply,
    ReclaimOutcome,
)

__all__ = [
    "AllocateRefused",
    "CardClaims",
    "CardHealthChanged",
    "CardUnhealthy",
    "Claim",
    "ClaimChanged",
    "ClaimsQuery",
    "ClaimsReply",
    "ContainerRequest",
    "DestroyFailed",
    "ForeignFound",
    "ForeignGone",
    "LiveInstance",
    "NodeCapacity",
    "PartitionEvent",
    "PendingPodsQuery",
    "PendingPodsReply",
    "PodEvent",
    "PodFinished",
    "PodGone",
    "PodRecord",
    "PodSeen",
    "PodsGet",
    "PodsGetReply",
    "PodsStates",
    "PodsStatesReply",
    "ReclaimNow",
    "ReclaimNowReply",
    "ReclaimOutcome",
    "SchemaError",
    "WorkdirCollected",
    "decode",
    "decode_request",
    "encode",
    "validate_pod_uid",
]
