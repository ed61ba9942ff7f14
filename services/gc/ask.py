"""The two questions the GC asks before deleting anything; any failure to answer is `None`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import nats.errors
from nats.aio.client import Client

from partkeeper.bus import Unanswered
from partkeeper.bus.clients import ClaimsClient, WatcherClient
from schemas import ClaimsReply, PodsGetReply

log = logging.getLogger(__name__)

T = TypeVar("T")
TIMEOUT_SECONDS = 2.0
# UIDs per pods.states request: 500 answers without their Pod records are about 100 KB, well
# under NATS's default max payload of 1 MB (schemas.rpc.PODS_STATES_MAX allows up to 1000).
BATCH = 500
FALLBACK_CONCURRENCY = 64  # pods.get in flight at once when the watcher predates pods.states


class Asked:
    """Round trips the GC made, per question: the regression guard of docs/benchmarks.md counts
    them per sweep."""

    def __init__(self) -> None:
        self.pods_get = 0
        self.pods_states = 0
        self.claims_query = 0

    @property
    def total(self) -> int:
        return self.pods_get + self.pods_states + self.claims_query


async def pod_state(nc: Client, node: str, uid: str, asked: Asked) -> PodsGetReply | None:
    """The watcher's answer for `uid`; None when it did not answer usably."""
    # Not `fresh`: the watcher's view is the truth and keeps tombstones of gone Pods; a fresh
    # read per directory would put a sweep's worth of GETs on the API server.
    asked.pods_get += 1
    return await _answer(f"pods.get for Pod {uid}",
                         WatcherClient(nc, node, TIMEOUT_SECONDS).pod(uid))


async def pod_states(
    nc: Client, node: str, uids: Sequence[str], asked: Asked
) -> dict[str, PodsGetReply] | None:
    """The watcher's answers for up to `BATCH` UIDs in one round trip; None when unanswered.

    A watcher that predates `pods.states` has no responder there: then each UID is asked with
    `pods.get`, as before, and the first one unanswered makes the whole batch unanswered.
    """
    asked.pods_states += 1
    try:
        reply = await WatcherClient(nc, node, TIMEOUT_SECONDS).states(list(uids))
    except Unanswered as exc:
        if not isinstance(exc.__cause__, nats.errors.NoRespondersError):
            log.info("pods.states for %d Pods unanswered (%s); nothing of them is deleted now",
                     len(uids), exc)
            return None
    else:
        return {p.uid: p for p in reply.pods}
    found: dict[str, PodsGetReply] = {}
    for start in range(0, len(uids), FALLBACK_CONCURRENCY):
        chunk = uids[start : start + FALLBACK_CONCURRENCY]
        answers = await asyncio.gather(*(pod_state(nc, node, uid, asked) for uid in chunk))
        for uid, answer in zip(chunk, answers, strict=True):
            if answer is None:
                return None
            found[uid] = answer
    return found


async def pod_claims(nc: Client, node: str, uid: str, asked: Asked) -> ClaimsReply | None:
    """The allocator's claims of `uid`; None when it did not answer usably."""
    asked.claims_query += 1
    return await _answer(f"claims.query for Pod {uid}",
                         ClaimsClient(nc, node, TIMEOUT_SECONDS).of_pod(uid))


async def _answer(what: str, asking: Awaitable[T]) -> T | None:
    """The answer, or None (logged) when the peer gave no usable one: nothing is deleted then."""
    try:
        return await asking
    except Unanswered as exc:
        log.info("%s unanswered (%s); nothing of it is deleted now", what, exc)
        return None
