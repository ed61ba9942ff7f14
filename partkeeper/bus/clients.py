"""One typed client per micro endpoint of a node: how a service asks another.

Each method sends the contract request and returns the contract reply, or raises
`Unanswered` (nobody answered in time, an error reply, an answer that cannot be read or is about
something else); a caller that gets `Unanswered` takes no action. What a caller does on top (a
bounded retry, turning "no answer" into a verdict) is the caller's policy, not the client's.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.client import Client

from partkeeper.bus.rpc import BadReply, request
from schemas import (
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
)
from schemas.names import (
    claims_query_subject,
    pods_get_subject,
    pods_pending_subject,
    pods_states_subject,
    reclaim_now_subject,
)

DEFAULT_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class WatcherClient:
    """`pk.<node>.pods.get` and `pk.<node>.pods.pending` (the watcher)."""

    nc: Client
    node: str
    timeout: float = DEFAULT_TIMEOUT

    async def pod(self, uid: str, *, fresh: bool = False) -> PodsGetReply:
        """The watcher's answer about Pod `uid` (with `fresh`: confirmed with the API server)."""
        subject = pods_get_subject(self.node)
        reply = await request(self.nc, subject, PodsGet(uid=uid, fresh=fresh), PodsGetReply,
                              timeout=self.timeout)
        if reply.uid != uid:
            raise BadReply(f"the watcher answered about Pod {reply.uid}, not {uid}")
        return reply

    async def states(self, uids: list[str]) -> PodsStatesReply:
        """The watcher's view of each of `uids` in one round trip (`pods.states`, never fresh).

        Raises `Unanswered` as `pod` does, `NoAnswer` from `NoRespondersError` included when the
        watcher predates `pods.states`; entries come back in the order asked, or the reply is
        refused as a whole.
        """
        reply = await request(self.nc, pods_states_subject(self.node), PodsStates(uids=uids),
                              PodsStatesReply, timeout=self.timeout)
        answered = [p.uid for p in reply.pods]
        if answered != uids:
            raise BadReply(f"the watcher answered pods.states about {len(answered)} Pods that "
                           f"are not the {len(uids)} asked, in order")
        return reply

    async def pending(self, resource: str, quantity: int, *, fresh: bool) -> PendingPodsReply:
        """Pending Pods of the node requesting `quantity` x `resource`, in admission order."""
        query = PendingPodsQuery(resource=resource, quantity=quantity, fresh=fresh)
        return await request(self.nc, pods_pending_subject(self.node), query, PendingPodsReply,
                             timeout=self.timeout)


@dataclass(frozen=True, slots=True)
class ClaimsClient:
    """`pk.<node>.claims.query` (the allocator)."""

    nc: Client
    node: str
    timeout: float = DEFAULT_TIMEOUT

    async def of_pod(self, uid: str) -> ClaimsReply:
        """The claims of Pod `uid` (every claim of the node when `uid` is empty)."""
        return await request(self.nc, claims_query_subject(self.node), ClaimsQuery(pod_uid=uid),
                             ClaimsReply, timeout=self.timeout)


@dataclass(frozen=True, slots=True)
class ReclaimerClient:
    """`pk.<node>.reclaim.now` (the reclaimer)."""

    nc: Client
    node: str
    timeout: float = DEFAULT_TIMEOUT

    async def now(self, claim_ids: list[str], reason: str) -> ReclaimNowReply:
        """Destroy now the partitions of these claims if their Pods are confirmed dead."""
        return await request(self.nc, reclaim_now_subject(self.node),
                             ReclaimNow(claim_ids=claim_ids, reason=reason), ReclaimNowReply,
                             timeout=self.timeout)
