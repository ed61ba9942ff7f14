"""The claims store: compare-and-set against a real JetStream KV; no lost update, fail closed."""

from __future__ import annotations

import asyncio

import pytest

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore, StoreReadError, TransitionError, machine
from partkeeper.claims.store import Mutation
from schemas.names import claims_key
from tests_support import make_claim


async def test_concurrent_writers_never_lose_an_update(js, node: str) -> None:
    kv = await Bucket.open(js, "pk-claims")
    a, b = ClaimsStore(kv, node), ClaimsStore(kv, node)

    async def add(store: ClaimsStore, i: int) -> None:
        await store.update(0, lambda d: machine.begin(d, make_claim(f"c{i}", i % 8, 1, card=0)))

    results = await asyncio.gather(
        *(add(a if i % 2 else b, i) for i in range(8)), return_exceptions=True
    )
    assert all(r is None for r in results), results
    doc, rev = await a.read(0)
    assert sorted(doc.claims) == [f"c{i}" for i in range(8)]
    assert rev > 0 and a.conflicts + b.conflicts > 0


async def test_overlapping_racers_only_one_wins(js, node: str) -> None:
    kv = await Bucket.open(js, "pk-claims")
    stores = [ClaimsStore(kv, node) for _ in range(4)]

    def begin(i: int) -> Mutation:
        return lambda d: machine.begin(d, make_claim(f"r{i}", 0, 4, card=1))

    results = await asyncio.gather(
        *(s.update(1, begin(i)) for i, s in enumerate(stores)),
        return_exceptions=True,
    )
    wins = [r for r in results if not isinstance(r, Exception)]
    assert len(wins) == 1
    assert all(isinstance(r, TransitionError) for r in results if isinstance(r, Exception))


async def test_refused_mutation_writes_nothing(js, node: str) -> None:
    kv = await Bucket.open(js, "pk-claims")
    store = ClaimsStore(kv, node)
    _, rev = await store.update(0, lambda d: machine.begin(d, make_claim("a", 0, 1, card=0)))
    with pytest.raises(TransitionError):
        await store.update(0, lambda d: machine.remove(d, "a"))
    assert (await store.read(0))[1] == rev


async def test_corrupt_document_fails_closed(js, node: str) -> None:
    kv = await Bucket.open(js, "pk-claims")
    await kv.kv.put(claims_key(node, 5), b'{"v": 1, "type": "CardClaims", "claims": 3}')
    store = ClaimsStore(kv, node)
    with pytest.raises(StoreReadError):
        await store.read(5)
    with pytest.raises(StoreReadError):
        await store.read_all()
    assert 5 in await store.cards()
