"""The allocator's own audit entries on PK_PARTITIONS (its claim transitions are announced by the
claims store's outbox, partkeeper/claims/outbox.py)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence

from nats.js import JetStreamContext

from partkeeper.bus import publish
from schemas import AllocateRefused
from schemas.names import parts_subject

log = logging.getLogger(__name__)


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
