"""`pk.<node>.claims.query` on the micro service `pk-allocator`: the claims of a Pod (all of the
node's when `pod_uid` is empty), with the revision of each card document they were read at.

Every card is read afresh; a failed read of any card answers an error, never a partial list, so
a caller (the GC) that needs to know a Pod holds nothing cannot be misled (invariant 9).
"""

from __future__ import annotations

from nats.aio.client import Client
from nats.micro.service import Service

from partkeeper import __version__
from partkeeper.bus import serve
from partkeeper.bus.rpc import Endpoint
from partkeeper.claims import ClaimsStore
from schemas import ClaimsQuery, ClaimsReply
from schemas.names import SERVICE_ALLOCATOR, claims_query_subject


async def answer(store: ClaimsStore, cards: list[int], query: ClaimsQuery) -> ClaimsReply:
    """The reply for one query. Raises StoreReadError (answered as an error) on any failure."""
    docs = await store.read_all(cards)
    claims = [
        claim
        for card in sorted(docs)
        for claim in docs[card][0].claims.values()
        if not query.pod_uid or claim.pod_uid == query.pod_uid
    ]
    return ClaimsReply(claims=claims, revisions={str(c): rev for c, (_, rev) in docs.items()})


async def start(nc: Client, node: str, store: ClaimsStore, cards: list[int]) -> Service:
    async def handle(query: ClaimsQuery) -> ClaimsReply:
        return await answer(store, cards, query)

    return await serve(
        nc,
        name=SERVICE_ALLOCATOR,
        version=__version__,
        description="partkeeper allocator: claims of this node's Pods",
        endpoints=[Endpoint("claims-query", claims_query_subject(node), ClaimsQuery, handle)],
    )
