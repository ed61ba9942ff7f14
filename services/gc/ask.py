"""The two questions the GC asks before deleting anything; any failure to answer is `None`."""

from __future__ import annotations

import logging

from nats.aio.client import Client

from partkeeper.bus import NoAnswer, RemoteError, request
from schemas import ClaimsQuery, ClaimsReply, PodsGet, PodsGetReply, SchemaError
from schemas.names import claims_query_subject, pods_get_subject

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 2.0


async def pod_state(nc: Client, node: str, uid: str) -> PodsGetReply | None:
    """The watcher's answer for `uid`; None when it did not answer usably."""
    # Not `fresh`: the watcher's view is the truth and keeps tombstones of gone Pods; a fresh
    # read per directory would put a sweep's worth of GETs on the API server.
    try:
        return await request(
            nc, pods_get_subject(node), PodsGet(uid=uid), PodsGetReply, timeout=TIMEOUT_SECONDS
        )
    except (NoAnswer, RemoteError, SchemaError) as exc:
        log.info("pods.get for Pod %s unanswered (%s); nothing of it is deleted now", uid, exc)
        return None


async def pod_claims(nc: Client, node: str, uid: str) -> ClaimsReply | None:
    """The allocator's claims of `uid`; None when it did not answer usably."""
    try:
        return await request(
            nc, claims_query_subject(node), ClaimsQuery(pod_uid=uid), ClaimsReply,
            timeout=TIMEOUT_SECONDS,
        )
    except (NoAnswer, RemoteError, SchemaError) as exc:
        log.info("claims.query for Pod %s unanswered (%s); nothing of it is deleted now", uid, exc)
        return None
