"""Allocate end to end: the simulated kubelet (real gRPC) admits Pods, the allocator serves them
over real NATS with the sim driver. Invariants 2, 4 and 7 of docs/contract.md section 3."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from partkeeper.claims import machine
from partkeeper.drivers import InstanceSpec
from partkeeper.workdir import descriptor_path
from partkeeper_sim.driver import FaultKind
from schemas import AllocateRefused, Claim, PartitionEvent, decode
from schemas.names import STREAM_PARTITIONS, parts_subject
from tests_support import instance_of, until
from tests_support.allocator import FAST, MIG, node_stack
from tests_support.gate import Gate
from tests_support.kubelet import pod_record

R1 = MIG + "1g.10gb"
R3 = MIG + "3g.40gb"
R4 = MIG + "4g.40gb"
R7 = MIG + "7g.80gb"
QUICK = replace(FAST, room_wait_seconds=0.5)
B = "0d1e2f3a-4b5c-4d6e-8f7a-8b9c0d1e2f3a"


def cancelled_calls() -> float:
    labels = {"resource": R1, "result": "cancelled"}
    return REGISTRY.get_sample_value("partkeeper_allocations_total", labels) or 0.0


async def test_inv7_retried_allocate_returns_the_same_partition(nc, js, node) -> None:
    # Without pod-resources: kubelet retries only for a container it lists without devices, and
    # this one (served, Running in kubelet) it would list with them. The watcher still shows
    # the Pod Pending, as it does while kubelet admits it.
    async with node_stack(nc, node, pod_resources=False) as n:
        uid = await n.add_pod("a", {"main": {R1: 1}})
        await n.phase(uid, "Running")
        [claim] = await n.claims_of(uid)
        first = pod_record(n.kubelet, uid).containers["main"].responses[R1]
        assert claim.state == "active" and claim.instance is not None
        assert first.envs["NVIDIA_VISIBLE_DEVICES"] == instance_of(claim).uuid

        again = await n.allocate(R1, list(claim.device_ids))  # kubelet retries the call

        assert again.envs["NVIDIA_VISIBLE_DEVICES"] == instance_of(claim).uuid
        assert [i.uuid for i in await n.instances()] == [instance_of(claim).uuid]
        assert [c.id for c in await n.claims()] == [claim.id]
        assert uid in n.watcher.fresh_asked  # a retry is told from a re-use by asking
        body = json.loads(descriptor_path(n.config.pods_dir, uid, "main",
                                          instance_of(claim).uuid).read_bytes())
        assert (body["claim_id"], body["start"], body["profile"]) == (claim.id, 0, "1g.10gb")


@pytest.mark.parametrize("created", [True, False], ids=["instance-made", "instance-not-made"])
async def test_inv7_creating_claim_left_by_a_crash_is_completed_by_the_retry(
    nc, js, node, created: bool
) -> None:
    async with node_stack(nc, node, pod_resources=False) as n:
        uid = "5d7f0c2e-9a1b-4c3d-8e7f-6a5b4c3d2e1f"
        await n.watcher.add(n.watcher.record(uid, "crashed", {"main": {R3: 1}}))
        now = time.time()
        claim = Claim(id="left-by-crash", state="creating", pod_uid=uid, namespace="default",
                      name="crashed", container="main", resource=R3, device_ids=["3g.40gb-1"],
                      card=0, profile="3g.40gb", start=4, size=4, created_at=now, updated_at=now)
        await n.store.update(0, lambda d: machine.begin(d, claim))
        made = n.driver.create(InstanceSpec(0, "3g.40gb", 4)) if created else None

        reply = await n.allocate(R3, ["3g.40gb-1"])

        [inst] = await n.instances()
        [done] = await n.claims()
        assert done.id == claim.id and done.state == "active"
        assert done.instance is not None and done.instance.uuid == inst.uuid
        assert reply.envs["NVIDIA_VISIBLE_DEVICES"] == inst.uuid
        assert made is None or made.uuid == inst.uuid  # adopted, not a second one


async def test_mutually_exclusive_profiles_on_one_card(nc, js, node) -> None:
    async with node_stack(nc, node) as n:
        a = await n.add_pod("a", {"main": {R4: 1}})
        await n.phase(a, "Running")
        await n.wait_healthy(R7, 0)  # the whole-card profile no longer fits
        await n.wait_healthy(R3, 1)  # 3g at 4 still does
        await n.wait_healthy(R1, 3)  # 1g at 4, 5, 6
        b = await n.add_pod("b", {"main": {R3: 1}})
        await n.phase(b, "Running")
        [claim_b] = await n.claims_of(b)
        assert (claim_b.start, claim_b.size) == (4, 4)
        await n.wait_healthy(R1, 0)
        c = await n.add_pod("c", {"main": {R7: 1}})
        await n.phase(c, "Failed")  # kubelet refuses admission: no Healthy 7g token
        assert "OutOf" in n.report(c)
        assert await n.claims_of(c) == []
        assert len(await n.instances()) == 2


async def test_full_card_is_refused_with_a_sentence_and_leaves_no_claim(nc, js, node) -> None:
    async with node_stack(nc, node, options=QUICK, pod_resources=False) as n:
        a = await n.add_pod("a", {"main": {R7: 1}})
        await n.phase(a, "Running")
        await n.watcher.add(n.watcher.record(B, "b", {"main": {R1: 1}}))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await n.allocate(R1, ["1g.10gb-0"])
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        message = refused.value.details()
        assert "no room for 1 1g.10gb partition(s) of nvidia.com/mig-1g.10gb" in message
        assert "card 0 (H100-80GB) holds 7g.80gb at slices 0-7 for Pod default/a" in message
        assert "live" in message and "Nothing was claimed" in message
        assert [c.pod_uid for c in await n.claims()] == [a]
        assert a in n.watcher.fresh_asked  # the live holder was confirmed before refusing
        stored = await js.get_last_msg(STREAM_PARTITIONS, parts_subject(node, None))
        event = decode(stored.data, PartitionEvent)
        assert isinstance(event, AllocateRefused)  # the watcher makes it an Event on Pod b
        assert (event.pod_uid, event.name, event.reason) == (B, "b", message)


@pytest.mark.parametrize("error", ["unknown", "halfway"])
async def test_a_failed_create_abandons_its_claim_only_when_nothing_is_left(
    nc, js, node, error: FaultKind
) -> None:
    """A create the driver stops halfway, its undo failing too, leaves a GPU instance without
    compute instance: the claim stays over it (abandoned, it would be foreign, a slot lost) and
    kubelet's retry completes it. A create that left nothing abandons its claim."""
    async with node_stack(nc, node, options=QUICK, pod_resources=False) as n:
        await n.watcher.add(n.watcher.record(B, "b", {"main": {R3: 1}}))
        n.sim.fail("create", 1, error)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await n.allocate(R3, ["3g.40gb-0"])
        message = refused.value.details()
        assert "creating 3g.40gb at" in message and "Pod default/b" in message
        if error == "unknown":
            assert "nothing is left behind" in message
            assert await n.claims() == [] and await n.instances() == []
            return
        [claim] = await n.claims()
        [left] = await n.instances()
        assert f"it left GPU instance {left.gi_id} (3g.40gb at {left.start})" in message
        assert (claim.state, claim.instance, claim.start) == ("creating", None, left.start)
        assert not left.complete

        reply = await n.allocate(R3, ["3g.40gb-0"])  # kubelet's retry

        [done] = await n.claims()
        [inst] = await n.instances()
        assert (done.id, done.state, inst.gi_id, inst.complete) == (claim.id, "active",
                                                                   left.gi_id, True)
        assert reply.envs["NVIDIA_VISIBLE_DEVICES"] == inst.uuid


async def test_allocate_after_a_pod_stopped_gets_the_freed_slot_not_a_refusal(
    nc, js, node
) -> None:
    """kubelet frees a stopped Pod's token before the watcher reports it: the replacement is
    admitted at once, and its Allocate has the old partition reclaimed instead of refusing."""
    async with node_stack(nc, node) as n:
        a = await n.add_pod("a", {"main": {R7: 1}})
        await n.phase(a, "Running")
        [old] = await n.claims_of(a)
        await n.kubelet.finish(a)  # containers exit; kubelet frees 7g.80gb-0 now
        await n.watcher.finish(a, lag=True)  # the API server knows; the watcher has not said

        b = await n.add_pod("b", {"main": {R7: 1}})
        await n.phase(b, "Running")

        [new] = await n.claims_of(b)
        assert new.state == "active" and new.device_ids == old.device_ids
        assert await n.claims_of(a) == []
        assert n.reclaimer.destroyed == [instance_of(old).uuid]
        assert [i.gi_id for i in await n.instances()] == [instance_of(new).gi_id]


@pytest.mark.parametrize("state", ["active", "releasing"])
async def test_room_held_by_a_gone_pod_is_reclaimed_now(nc, js, node, state: str) -> None:
    async with node_stack(nc, node, pod_resources=False) as n:
        a = await n.add_pod("a", {"main": {R7: 1}})
        await n.phase(a, "Running")
        [old] = await n.claims_of(a)
        if state == "releasing":
            await n.store.update(0, lambda d: machine.release(d, old.id, "slow", time.time()))
        await n.watcher.gone(a)
        b = "0d1e2f3a-4b5c-4d6e-8f7a-8b9c0d1e2f3a"
        await n.watcher.add(n.watcher.record(b, "b", {"main": {R1: 1}}))

        reply = await n.allocate(R1, ["1g.10gb-3"])

        [new] = await n.claims()
        assert new.pod_uid == b and reply.envs["NVIDIA_VISIBLE_DEVICES"] == instance_of(new).uuid
        assert [[old.id]] == n.reclaimer.asked


async def test_inv2_allocator_never_destroys_a_dead_holder_itself(nc, js, node) -> None:
    async with node_stack(nc, node, options=QUICK, pod_resources=False) as n:
        a = await n.add_pod("a", {"main": {R7: 1}})
        await n.phase(a, "Running")
        await n.reclaimer.stop()  # nobody answers reclaim.now
        await n.watcher.gone(a)
        await n.watcher.add(n.watcher.record("0d1e2f3a-4b5c-4d6e-8f7a-8b9c0d1e2f3a", "b",
                                             {"main": {R1: 1}}))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await n.allocate(R1, ["1g.10gb-0"])
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "confirmed finished or gone" in refused.value.details()
        assert len(await n.instances()) == 1  # still there: only the reclaimer destroys
        assert [c.pod_uid for c in await n.claims()] == [a]


async def parked_create(n: Any, gate: Gate, resource: str) -> tuple[str, Claim]:
    """A Pod asking one `resource`, its claim written and the driver's create parked in `gate`
    (the test opens it). Returns the Pod's UID and its claim."""
    n.driver.latency("create", 1)  # the create parks in the gate until the test opens it
    a = await n.add_pod("a", {"main": {resource: 1}})

    async def claimed() -> bool:
        return bool(await n.claims_of(a))

    await until(claimed, "a claim for the Pod exists")
    await until(gate.entered.is_set, "the driver's create is in flight")
    [claim] = await n.claims_of(a)
    return str(a), claim


async def released_during_create(n: Any, gate: Gate) -> str:
    """A Pod whose claim the reclaimer releases (the Pod was deleted) while the driver's create
    is parked in `gate`; the gate is open when this returns. Returns the Pod's UID."""
    a, claim = await parked_create(n, gate, R1)
    assert claim.state == "creating"
    await n.watcher.gone(a)  # the Pod was deleted meanwhile; the reclaimer releases
    await n.store.update(0, lambda d: machine.release(d, claim.id, "PodGone", time.time()))
    gate.open()
    return a


async def test_inv2_released_during_create_is_undone_by_the_allocator(nc, js, node) -> None:
    gate = Gate()
    async with node_stack(nc, node, gate=gate) as n:
        a = await released_during_create(n, gate)

        await n.phase(a, "Failed")
        assert "declared gone while its partition was being created" in n.report(a)
        assert await n.instances() == []  # the allocator undid its own, never-activated create
        assert await n.claims() == []


async def test_inv4_claim_is_in_the_store_before_the_driver_creates(nc, js, node) -> None:
    gate = Gate()
    async with node_stack(nc, node, gate=gate) as n:
        a, claim = await parked_create(n, gate, R3)
        assert claim.state == "creating" and claim.instance is None
        assert await n.instances() == []  # the driver has not made it yet
        gate.open()
        await n.phase(a, "Running")
        [inst] = await n.instances()
        [active] = await n.claims_of(a)
        assert active.instance is not None and active.instance.uuid == inst.uuid


async def test_several_tokens_give_several_partitions(nc, js, node) -> None:
    async with node_stack(nc, node, cards=("H100-80GB", "H100-80GB")) as n:
        a = await n.add_pod("a", {"main": {R3: 3}})
        await n.phase(a, "Running")
        claims = await n.claims_of(a)
        response = pod_record(n.kubelet, a).containers["main"].responses[R3]
        uuids = response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(uuids) == 3 == len(claims)
        assert sorted((c.card, c.start) for c in claims) == [(0, 0), (0, 4), (1, 0)]
        assert {instance_of(c).uuid for c in claims} == set(uuids)
        for c in claims:
            assert descriptor_path(n.config.pods_dir, a, "main", instance_of(c).uuid).exists()


async def test_allocate_with_no_pending_pod_is_refused(nc, js, node) -> None:
    fast_lookup = replace(QUICK, lookup=replace(QUICK.lookup, attempts=2))
    async with node_stack(nc, node, options=fast_lookup, pod_resources=False) as n:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await n.allocate(R1, ["1g.10gb-0"])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no pending Pod" in refused.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await n.allocate(R1, ["no-such-token"])
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert await n.claims() == []


async def test_cancelled_wait_for_room_writes_nothing(nc, js, node) -> None:
    slow = replace(FAST, room_wait_seconds=30)
    async with node_stack(nc, node, options=slow, pod_resources=False) as n:
        a = await n.add_pod("a", {"main": {R7: 1}})
        await n.phase(a, "Running")
        await n.watcher.add(n.watcher.record("0d1e2f3a-4b5c-4d6e-8f7a-8b9c0d1e2f3a", "b",
                                             {"main": {R1: 1}}))
        asked = len(n.watcher.fresh_asked)
        before = cancelled_calls()
        call = asyncio.create_task(n.allocate(R1, ["1g.10gb-0"], timeout=30))
        await until(lambda: len(n.watcher.fresh_asked) > asked, "the allocator waits for room")
        call.cancel()  # kubelet gives up on the call
        await asyncio.gather(call, return_exceptions=True)
        await until(lambda: cancelled_calls() > before, "the allocator ends the call")
        await n.watcher.finish(a)  # room would now be made, but nobody waits for it any more
        await until(lambda: n.healthy(R1) == 0, "tokens of the finished holder stay Unhealthy")
        assert [c.pod_uid for c in await n.claims()] == [a]


async def test_a_placement_carved_by_hand_during_the_create_is_planned_again(
    nc, js, node
) -> None:
    gate = Gate()
    async with node_stack(nc, node, gate=gate) as n:
        a, first = await parked_create(n, gate, R1)
        foreign = await asyncio.to_thread(n.sim.carve, 0, "1g.10gb", first.start)
        gate.open()
        await n.phase(a, "Running")
        [claim] = await n.claims_of(a)
        assert claim.id != first.id and claim.start != first.start
        assert sorted(i.uuid for i in await n.instances()) == sorted(
            [foreign.uuid, instance_of(claim).uuid])


async def test_inv2_an_undo_that_cannot_destroy_is_left_to_the_reclaimer(nc, js, node) -> None:
    gate = Gate()
    async with node_stack(nc, node, gate=gate) as n:
        n.sim.fail("destroy", 1)  # the allocator's undo will fail once
        a = await released_during_create(n, gate)

        await n.phase(a, "Failed")
        [inst] = await n.instances()
        [left] = await n.claims_of(a)
        assert left.state == "releasing"  # the allocator tried once; now it is the reclaimer's
        assert left.instance is not None and left.instance.uuid == inst.uuid
