"""Builders of partition audit-log entries, as the allocator and the reclaimer publish them."""

from __future__ import annotations

from typing import Any

import msgspec

from schemas import AllocateRefused, CardUnhealthy, ClaimChanged, DestroyFailed
from schemas.events import ClaimState

UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
MIG = "MIG-4f1c7a52-9e1e-5b1f-8a33-0d2b9c1e7a10"


def claim(state: ClaimState, **fields: Any) -> ClaimChanged:
    base = ClaimChanged(
        node="n", at=1.0, card=1, claim_id="c1", pod_uid=UID, namespace="ml", name="train-0",
        container="main", profile="1g.10gb", start=2, size=2, state=state,
        instance_uuid=MIG, reason="",
    )
    return msgspec.structs.replace(base, **fields)


def destroy_failed(**fields: Any) -> DestroyFailed:
    base = DestroyFailed(
        node="n", at=1.0, card=1, claim_id="c1", pod_uid=UID, instance_uuid=MIG,
        reason="in_use", message="a process holds the instance", attempts=3,
    )
    return msgspec.structs.replace(base, **fields)


def refused(**fields: Any) -> AllocateRefused:
    base = AllocateRefused(
        node="n", at=1.0, resource="nvidia.com/mig-1g.10gb", device_ids=["t2", "t1"],
        reason="no 1g.10gb placement is free on any card", pod_uid=UID, namespace="ml",
        name="train-0",
    )
    return msgspec.structs.replace(base, **fields)


def card_unhealthy(**fields: Any) -> CardUnhealthy:
    base = CardUnhealthy(
        node="n", at=1.0, card=1, cause="xid-48", xid=48,
        meaning="XID 48: double-bit ECC error: uncorrectable memory error", claim_id="c1",
        pod_uid=UID, namespace="ml", name="train-0", instance_uuid=MIG,
    )
    return msgspec.structs.replace(base, **fields)
