"""Truthful capacity, as kubelet and pk-capacity see it (invariant 5): a slot is advertised free
only when no claim and no physical instance covers it; tokens of releasing claims and of stopped
Pods stay Unhealthy until the destroy is confirmed."""

from __future__ import annotations

import asyncio
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from partkeeper.claims import machine
from partkeeper.drivers import Card
from partkeeper.drivers.base import slot_identity
from partkeeper.drivers.profiles import model, overlaps
from schemas import CardClaims, NodeCapacity, decode
from schemas.names import BUCKET_CAPACITY, capacity_key
from services.allocator.core import catalog
from services.allocator.core.advertise import advertise
from services.allocator.core.placement import Snapshot
from tests_support import make_claim, until
from tests_support.allocator import MIG, node_stack

R1 = MIG + "1g.10gb"
R3 = MIG + "3g.40gb"
R7 = MIG + "7g.80gb"


async def capacity_doc(js, node: str) -> NodeCapacity | None:
    kv = await js.key_value(BUCKET_CAPACITY)
    try:
        entry = await kv.get(capacity_key(node))
    except Exception:
        return None
    return decode(entry.value, NodeCapacity)


async def test_inv5_releasing_claim_tokens_unhealthy_until_destroy_confirmed(
    nc, js, node
) -> None:
    async with node_stack(nc, node) as n:
        a = await n.add_pod("a", {"main": {R1: 1}})
        await n.phase(a, "Running")
        [claim] = await n.claims_of(a)
        [token] = claim.device_ids
        await n.wait_healthy(R1, 7)  # its own (held, live) and the 6 placeable ones

        await n.store.update(0, lambda d: machine.release(d, claim.id, "PodGone", time.time()))
        await until(lambda: n.devices(R1)[token] == "Unhealthy", "the token turns Unhealthy")
        assert n.healthy(R1) == 6

        [inst] = await n.instances()
        await asyncio.to_thread(n.driver.destroy, inst)  # destroyed, claim not yet removed
        await until(lambda: n.kubelet.devices(R1) and n.healthy(R1) == 6, "still 6")

        seen: list[NodeCapacity | None] = []

        async def published_six() -> bool:
            doc = await capacity_doc(js, node)
            seen[:] = [doc]
            return doc is not None and doc.cards[0].instances == [] and \
                doc.resources[R1].healthy == 6 and doc.cards[0].pending_reclaims == 1
        try:
            await until(published_six, "pk-capacity says the slot is not free yet")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last document: {seen}; kubelet: {n.devices(R1)}; "
                                 f"instances: {await n.instances()}") from None
        assert n.devices(R1)[token] == "Unhealthy"
        doc = await capacity_doc(js, node)
        assert doc is not None
        assert doc.resources[R7].healthy == 0  # the claim alone still covers slice 0

        await n.store.update(0, lambda d: machine.remove(d, claim.id))  # destroy confirmed
        await n.wait_healthy(R1, 7)


async def test_tokens_of_a_finished_pod_are_unhealthy_until_reclaimed(nc, js, node) -> None:
    async with node_stack(nc, node) as n:
        a = await n.add_pod("a", {"main": {R7: 1}})
        await n.phase(a, "Running")
        await n.wait_healthy(R7, 1)  # held by the live Pod
        await n.kubelet.finish(a)  # kubelet frees the token at once...
        await n.watcher.finish(a)  # ...and the watcher reports the Pod finished
        await n.wait_healthy(R7, 0)  # so kubelet cannot hand it out before the destroy
        b = await n.add_pod("b", {"main": {R7: 1}})
        await n.phase(b, "Failed")  # no Healthy token: not admitted (it would have been refused)
        [claim] = await n.claims_of(a)
        await n.reclaimer.reclaim(claim)
        await n.wait_healthy(R7, 1)


async def test_inv5_a_foreign_instance_lowers_capacity(nc, js, node) -> None:
    async with node_stack(nc, node) as n:
        await n.wait_healthy(R7, 1)
        foreign = await asyncio.to_thread(n.sim.carve, 0, "3g.40gb", 0)
        await n.wait_healthy(R7, 0)
        await n.wait_healthy(R3, 1)
        await n.wait_healthy(R1, 3)

        async def reported() -> bool:
            doc = await capacity_doc(js, node)
            return doc is not None and any(i.foreign and i.uuid == foreign.uuid
                                           for i in doc.cards[0].instances)
        await until(reported, "pk-capacity lists the foreign instance")
        doc = await capacity_doc(js, node)
        assert doc is not None
        assert doc.cards[0].free["7g.80gb"] == 0 and doc.cards[0].free["3g.40gb"] == 1
        assert doc.resources[R7].free == 0 and doc.resources[R7].unhealthy == 1

        a = await n.add_pod("a", {"main": {R3: 1}})
        await n.phase(a, "Running")
        [claim] = await n.claims_of(a)
        assert claim.start == 4  # placed beside the foreign instance, never over it

        await asyncio.to_thread(n.driver.destroy, foreign)  # the operator removes it
        await n.wait_healthy(R3, 2)


# -- the same guarantee as a property of the advertisement -------------------------------------

H100 = Card(0, "GPU-0", "H100-80GB", "partition", model("H100-80GB").memory_mib)
OFFERS = catalog.offers([H100], prefix=MIG, sliced_resource="s", slices_per_card=4)
spans = st.tuples(st.integers(0, 7), st.integers(1, 8)).filter(lambda r: r[0] + r[1] <= 8)


@given(st.lists(spans, max_size=3), st.lists(spans, max_size=3), st.sets(st.integers(0, 2)))
@settings(max_examples=200, deadline=None)
def test_inv5_healthy_free_tokens_never_exceed_what_fits_beside_claims_and_instances(
    claimed, physical, dead
) -> None:
    from partkeeper.drivers import Instance

    claims = [make_claim(f"c{i}", s, z) for i, (s, z) in enumerate(claimed)]
    instances = [Instance(0, "x", s, z, i + 1, 0, f"MIG-{i}") for i, (s, z) in
                 enumerate(physical)]
    doc = CardClaims(node="n", card=0, claims={c.id: c for c in claims})
    snap = Snapshot({0: H100}, {0: doc}, {0: 1}, {0: tuple(instances)}, slot_identity,
                    frozenset(c.pod_uid for i, c in enumerate(claims) if i in dead))
    advert = advertise(OFFERS, snap, "n", 0.0)
    taken = [(c.start, c.size) for c in claims] + [i.placement for i in instances]
    for offer in OFFERS.values():
        free_slots = [r for r in offer.legal[0] if not any(overlaps(r, t) for t in taken)]
        healthy = sum(advert.health[offer.resource].values())
        assert healthy <= len(free_slots)  # no claim of this resource holds tokens here
        if not free_slots:
            assert healthy == 0
