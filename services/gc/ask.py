"""The two questions the GC asks before deleting anything; any failure to answer is `None`."""

from __future__ import annotations

import logging

from nats.aio.client import Client

from partkeeper.bus import Unanswered
from partkeeper.bus.clients import ClaimsClient, WatcherClient
from schemas import ClaimsReply, PodsGetReply

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 2.0


async def pod_state(nc: Client, node: str, uid: str) -> PodsGetReply | None:
    """The watcher's answer for `uid`; None when it did not answer usably."""
    # Not `fresh`: the watcher's view is the truth and keeps tombstones of gone Pods; a fresh
    # read per directory would put a sweep's worth of GETs on the API server.
    try:
        return await WatcherClient(nc, node, TIMEOUT_SECONDS).pod(uid)
    except Unanswered as exc:
        log.info("pods.get for Pod %s unanswered (%s); nothing of it is deleted now", uid, exc)
        return None


async def pod_claims(nc: Client, node: str, uid: str) -> ClaimsReply | None:
    """The allocator's claims of `uid`; None when it did not answer usably."""
    try:
        return await ClaimsClient(nc, node, TIMEOUT_SECONDS).of_pod(uid)
    except Unanswered as exc:
        log.info("claims.query for Pod %s unanswered (%s); nothing of it is deleted now", uid, exc)
        return None
