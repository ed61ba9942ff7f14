"""Removing a destroyed partition's descriptor (through the project's safe path helpers) and its
CDI spec.

The descriptor (`PK_PODS_DIR/<uid>/c-<container>/partition-<uuid>.json`) is written by the
allocator and removed here once the destroy is confirmed; the empty container and Pod directories
go with it, and nothing else does. A failure is logged and does not hold the claim: the claim
fences the hardware, the descriptor only describes it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from partkeeper import cdi
from partkeeper.telemetry.logs import decision
from partkeeper.workdir import WorkdirError, remove_descriptor
from schemas import Claim

log = logging.getLogger(__name__)


async def drop_descriptor(root: Path, claim: Claim, mig_uuid: str) -> None:
    fields = {"pod_uid": claim.pod_uid, "card": claim.card, "claim_id": claim.id}
    try:
        removed = await asyncio.to_thread(
            remove_descriptor, root, claim.pod_uid, claim.container, mig_uuid
        )
    except (WorkdirError, OSError) as exc:
        log.error(
            "could not remove the descriptor of %s in container %s: %s; the claim is removed "
            "anyway", mig_uuid, claim.container, exc, extra=fields,
        )
        return
    decision(log, "descriptor removed", instance_uuid=mig_uuid, removed=removed, **fields)


async def drop_cdi_spec(cdi_dir: Path, claim: Claim) -> None:
    """Remove the claim's CDI spec, if the allocator wrote one (the CDI strategy)."""
    fields = {"pod_uid": claim.pod_uid, "card": claim.card, "claim_id": claim.id}
    try:
        removed = await asyncio.to_thread(cdi.remove_spec, cdi_dir, claim.id)
    except cdi.CdiError as exc:
        log.error("%s; the claim is removed anyway", exc, extra=fields)
        return
    if removed:
        decision(log, "CDI spec removed", **fields)
