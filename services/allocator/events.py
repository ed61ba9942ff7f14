"""The audit log: every claim transition the allocator makes, published on PK_PARTITIONS."""

from __future__ import annotations

import logging
import time

from nats.js import JetStreamContext

from partkeeper.bus import publish
from schemas import Claim, ClaimChanged
from schemas.events import ClaimState
from schemas.names import parts_subject

log = logging.getLogger(__name__)


async def claim_changed(
    js: JetStreamContext,
    node: str,
    claim: Claim,
    state: ClaimState,
    *,
    instance_uuid: str | None = None,
    reason: str = "",
) -> None:
    """Publish `ClaimChanged` with msg id `claim/<id>/<state>` (the fact, not the attempt).

    The store already holds the transition; a failed publish is logged and not retried here, so an
    unreachable audit stream never turns a made allocation into a refusal.
    """
    event = ClaimChanged(
        node=node,
        at=time.time(),
        card=claim.card,
        claim_id=claim.id,
        pod_uid=claim.pod_uid,
        namespace=claim.namespace,
        name=claim.name,
        container=claim.container,
        profile=claim.profile,
        start=claim.start,
        size=claim.size,
        state=state,
        instance_uuid=instance_uuid,
        reason=reason,
    )
    try:
        subject = parts_subject(node, claim.card)
        await publish(js, subject, event, msg_id=f"claim/{claim.id}/{state}")
    except Exception as exc:
        log.warning(
            "could not publish claim %s %s for Pod %s on card %d: %s",
            claim.id, state, claim.pod_uid, claim.card, exc,
            extra={"pod_uid": claim.pod_uid, "card": claim.card, "claim_id": claim.id},
        )
