"""A node reboot with Pods running, on the whole stack (real NATS, the four services as
processes, the simulated API server, scheduler and kubelet), in each mode: a plain restart first
(the same boot id: nothing re-made, nothing written), then the services stopped, `sim reboot`, a
new boot id, the services back, and kubelet starting the running Pods' containers again
(tests_support/reboot.py says why the test makes kubelet's calls itself). docs/operations.md,
"After a reboot"."""

from __future__ import annotations

import pytest
from rich.console import Console

from partkeeper import status as node_status
from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.drivers.profiles import overlaps
from partkeeper_sim.driver import SimDriver
from partkeeper_sim.stack.kube import NAMESPACE as DP_NAMESPACE
from partkeeper_sim.stack.migrate import NAMESPACE, PROFILES, Migration
from schemas import Claim
from schemas.names import BUCKET_CLAIMS
from tests_support import until
from tests_support.churn import Sentinel, Workload
from tests_support.converge import Reader, converged
from tests_support.reboot import (
    allocate,
    claims_and_boot,
    empty_card_free,
    instances,
    kubelet_devices,
    prepare,
    reboot_host,
    start_services,
    stop_services,
    visible,
)
from tests_support.rig import Rig, open_rig

pytestmark = [pytest.mark.stack, pytest.mark.timeout(420)]
CONVERGE_SECONDS = 60.0


async def store_of(rig: Rig) -> ClaimsStore:
    bucket = await Bucket.open(rig.stack.nc.jetstream(), BUCKET_CLAIMS)
    return ClaimsStore(bucket, rig.stack.node)


def partition_cards(rig: Rig) -> dict[int, str]:
    listed = SimDriver(rig.layout.cluster.sim_state).list()["cards"]
    return {c["index"]: c["model"] for c in listed if c["mode"] == "partition"}


async def claims_by_pod(store: ClaimsStore, cards: dict[int, str]) -> dict[str, Claim]:
    """Pod UID -> its claim (each Pod here holds one), over every card with a document."""
    docs = await store.read_all(list(cards))
    return {c.pod_uid: c for doc, _ in docs.values() for c in doc.claims.values()}


async def nothing_counted(rig: Rig, store: ClaimsStore, cards: dict[int, str]) -> None:
    """Before kubelet asks again: no instance, no foreign one, and every partition card's room
    whole in what the allocator publishes (the claims a reboot left hold nothing)."""
    assert not instances(rig), "the reboot left instances"
    expected = {card: empty_card_free(name) for card, name in cards.items()}

    async def whole() -> bool:
        doc = await node_status.gather(rig.stack.node, (rig.stack.nats_url,),
                                       auth=rig.stack.auth)
        seen = {c["index"]: c for c in doc["cards"] if c["index"] in cards}
        # `partkeeper status` shows the kept claims as rebooted, holding no room.
        shown = [c for i in cards for c in seen[i]["claims"]]
        return all(not seen[i]["instances"] and seen[i]["free"] == expected[i] for i in cards) \
            and bool(shown) and all(c["rebooted"] for c in shown)

    await until(whole, f"each partition card's room whole after the reboot: {expected}", 60)
    docs = await store.read_all(list(cards))
    marked = [c for doc, _ in docs.values() for c in doc.claims.values() if c.rebooted]
    assert marked, "the claims of the running Pods are kept, marked rebooted"


async def test_device_plugin_pods_get_their_partitions_back_after_a_reboot() -> None:
    async with open_rig() as rig:
        work = Workload(rig.stack)
        await work.start()
        store = await store_of(rig)
        reader = Reader(work.kube.api, store, rig.layout.cluster.sim_state,
                        rig.layout.pods_dir, rig.stack.node)
        cards = partition_cards(rig)
        try:
            kept = [await work.admit(p, "keep") for p in ("3g.40gb", "2g.20gb", "1g.10gb")]
            kept.append(await work.admit(None, "slice"))
            ended = await work.admit("1g.10gb", "ends")
            assert not [p.refused for p in (*kept, ended) if p.refused]
            held = await kubelet_devices(rig)  # kubelet's checkpoint
            before = await claims_by_pod(store, cards)
            made = instances(rig)

            # A plain restart: the same boot id, so nothing is marked, re-made or written.
            recorded = await claims_and_boot(store, list(cards))
            assert all(boot for _, boot in recorded.values())
            await stop_services(rig)
            await start_services(rig)
            assert await claims_and_boot(store, list(cards)) == recorded
            assert instances(rig) == made

            # The reboot, and a Pod deleted while the node was down.
            await stop_services(rig)
            reboot_host(rig)
            await work.delete(ended)
            await start_services(rig)
            await nothing_counted(rig, store, cards)
            # The room the reboot freed is offered: a new Pod is admitted into it before kubelet
            # has started the old ones again, and may take an old placement.
            newcomer = await work.admit("1g.10gb", "new")
            assert not newcomer.refused, newcomer.refused
            fresh = (await claims_by_pod(store, cards))[newcomer.uid].instance
            assert fresh is not None
            taken = instances(rig)[fresh.uuid]

            # kubelet starts the running Pods' containers again, with its checkpoint's IDs.
            partitions = [p for p in kept if p.kind == "partition"]
            moved = 0
            for pod in partitions:
                [(_container, resources)] = held[f"{DP_NAMESPACE}/{pod.name}"].items()
                [(resource, ids)] = resources.items()
                first = await allocate(rig, resource, ids)
                again = await allocate(rig, resource, ids)  # a retry: the same partition
                assert visible(first) == visible(again)
                now = instances(rig)
                assert visible(first) in now
                old, inst = before[pod.uid], now[visible(first)]
                covered = old.card == taken["card"] and overlaps(
                    (old.start, old.size), (taken["start"], taken["size"]))
                if covered:  # its old placement is the newcomer's: the lowest free legal one
                    moved += 1
                    assert inst["card"] == old.card and inst["start"] != old.start
            assert moved, f"the newcomer at {taken} took no old placement: nothing moved"
            await converged(reader.snapshot, deadline=CONVERGE_SECONDS,
                            resources=lambda r: "/" in r)
            after = await claims_by_pod(store, cards)
            assert ended.uid not in after, "the deleted Pod's claim was released and removed"
            for pod in partitions:
                claim = after[pod.uid]
                assert claim.id == before[pod.uid].id and claim.remakes == 1
                assert claim.device_ids == before[pod.uid].device_ids
            sentinel = Sentinel(work)
            await sentinel.check()
            assert not sentinel.violations
        finally:
            await work.stop()



async def test_dra_pods_get_their_partitions_back_after_a_reboot() -> None:
    # Unchanged Pod specs served through DRA (the allocator in DRA mode, the cluster's DRA side),
    # as the migration test runs them.
    async with open_rig(mode="both", overrides={"allocator": {"PK_MODE": "dra"}}) as rig:
        m = Migration(rig.stack, rig.supervisor, Console(quiet=True))
        store = await store_of(rig)
        reader = Reader(m.core, store, rig.layout.cluster.sim_state, rig.layout.pods_dir,
                        rig.stack.node)
        cards = partition_cards(rig)
        names = [f"dra-{p.replace('.', '')}" for p in PROFILES]
        await m.admit(names, None)
        pods = await m.pods()
        rcs = {(r.metadata.owner_references or [])[0].name: r for r in (await m.call(
            m.resource.list_namespaced_resource_claim, NAMESPACE)).items}
        assert sorted(rcs) == sorted(names)
        allocated = await m.allocated()
        before = await claims_by_pod(store, cards)
        made = instances(rig)
        assert len(made) == len(names)

        # A plain restart: the same boot id, so nothing is marked, re-made or written.
        recorded = await claims_and_boot(store, list(cards))
        await stop_services(rig)
        await start_services(rig)
        assert await claims_and_boot(store, list(cards)) == recorded
        assert instances(rig) == made

        # The reboot, and a Pod (with its special ResourceClaim) deleted while the node was down.
        ended, *kept = names
        await stop_services(rig)
        reboot_host(rig)
        await m.call(m.core.delete_namespaced_pod, ended, NAMESPACE)
        await start_services(rig)
        await nothing_counted(rig, store, cards)

        # kubelet prepares the running Pods' claims again.
        asked = [(NAMESPACE, rcs[n].metadata.uid, rcs[n].metadata.name) for n in kept]
        first = await prepare(rig, asked)
        again = await prepare(rig, asked)  # a retry: the same CDI devices
        for _, uid, name in asked:
            assert not first[uid].error, f"{name}: {first[uid].error}"
            assert [list(d.cdi_device_ids) for d in first[uid].devices] == \
                [list(d.cdi_device_ids) for d in again[uid].devices]
        now = await m.partitions()
        assert sorted(now.values(), key=str) == sorted((allocated[n] for n in kept), key=str), \
            "each re-made at its allocated device's placement, nothing else"

        await converged(reader.snapshot, deadline=CONVERGE_SECONDS, resources=lambda _r: False)
        after = await claims_by_pod(store, cards)
        assert pods[ended].metadata.uid not in after, "the ended Pod's claim is removed"
        for name in kept:
            uid = pods[name].metadata.uid
            claim = after[uid]
            assert claim.state == "active" and claim.remakes == 1 and not claim.rebooted
            assert claim.id == before[uid].id and claim.instance is not None
            assert claim.instance.uuid in now
        running = await m.pods()
        assert all(running[n].status.phase == "Running" for n in kept)
