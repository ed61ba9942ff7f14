"""`ClaimsStore.update(known=...)`: a write against a revision the caller holds saves the read,
and never changes the outcome (issue 27): a stale revision is refused by the server and the
mutation is judged again on a fresh read, so no update is lost and no refusal is kept that the
current document would not make."""

from __future__ import annotations

from partkeeper.bus.kv import Bucket
from partkeeper.bus.trips import count, kinds
from partkeeper.claims import ClaimsStore, machine
from tests_support import make_claim


async def test_a_current_known_revision_writes_without_reading(nc, js, node: str) -> None:
    store = ClaimsStore(await Bucket.open(js, "pk-claims"), node)
    known = await store.update(0, lambda d: machine.begin(d, make_claim("a", 0, 1, card=0)))
    trips = count(nc)
    doc, _ = await store.update(0, lambda d: machine.begin(d, make_claim("b", 2, 1, card=0)),
                                known=known)
    assert kinds(trips.made) == {"kv cas pk-claims": 1}
    assert sorted(doc.claims) == ["a", "b"] and sorted((await store.read(0))[0].claims) == [
        "a", "b"]


async def test_a_stale_known_revision_loses_no_update(js, node: str) -> None:
    store = ClaimsStore(await Bucket.open(js, "pk-claims"), node)
    stale = await store.update(0, lambda d: machine.begin(d, make_claim("a", 0, 1, card=0)))
    await store.update(0, lambda d: machine.begin(d, make_claim("b", 2, 1, card=0)))
    doc, _ = await store.update(0, lambda d: machine.begin(d, make_claim("c", 4, 1, card=0)),
                                known=stale)
    assert sorted(doc.claims) == ["a", "b", "c"]
    assert sorted((await store.read(0))[0].claims) == ["a", "b", "c"]


async def test_a_refusal_on_a_stale_document_is_judged_again_on_a_fresh_one(
    js, node: str
) -> None:
    store = ClaimsStore(await Bucket.open(js, "pk-claims"), node)
    stale = await store.update(0, lambda d: machine.begin(d, make_claim("a", 0, 1, card=0)))
    await store.update(0, lambda d: machine.remove(d, "a", abandon=True))
    # On `stale`, "b" overlaps "a"; on the store's document "a" is gone and "b" fits.
    doc, _ = await store.update(0, lambda d: machine.begin(d, make_claim("b", 0, 1, card=0)),
                                known=stale)
    assert sorted(doc.claims) == ["b"]
