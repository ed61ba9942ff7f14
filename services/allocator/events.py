"""The audit log: every claim transition the allocator makes, published on PK_PARTITIONS."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence

from nats.js import JetStreamContext

from partkeeper.bus import publish
from schemas import AllocateRefused, Claim, ClaimChanged
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


async def allocate_refused(
    js: JetStreamContext,
    node: str,
    resource: str,
    device_ids: Sequence[str],
    reason: str,
    pod: tuple[str, str, str] | None,
) -> None:
    """Publish `AllocateRefused` (the watcher turns it into an Event on the Pod, when named).

    The msg id names the fact (Pod, resource, device IDs, sentence), so a refusal published twice
    is stored once."""
    uid, namespace, name = pod or ("", "", "")
    event = AllocateRefused(node=node, at=time.time(), resource=resource,
                            device_ids=list(device_ids), reason=reason, pod_uid=uid,
                            namespace=namespace, name=name)
    fact = "\n".join([uid, resource, ",".join(sorted(device_ids)), reason])
    msg_id = f"refused/{hashlib.sha256(fact.encode()).hexdigest()[:32]}"
    try:
        await publish(js, parts_subject(node, None), event, msg_id=msg_id)
    except Exception as exc:
        log.warning("could not publish the refusal of %s %s for Pod %s: %s", resource,
                    ",".join(device_ids), uid or "(unknown)", exc, extra={"pod_uid": uid or None})
