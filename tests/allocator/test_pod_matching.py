"""Allocate serves the Pod kubelet is admitting, and no one else (docs/allocator.md, "Which Pod an
Allocate serves"). One regression test per way the inference used to hand a partition to the
wrong Pod or refuse the right one, against the simulated kubelet over real gRPC and real NATS."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import grpc
import nats.errors
import pytest

from partkeeper.claims import ClaimsStore, machine
from partkeeper.drivers import InstanceSpec
from schemas import Claim
from tests_support import instance_of, until
from tests_support.allocator import FAST, MIG, new_uid, node_stack
from tests_support.kubelet import pod_record

R1 = MIG + "1g.10gb"
R3 = MIG + "3g.40gb"
R7 = MIG + "7g.80gb"
QUICK = replace(FAST, room_wait_seconds=0.5)


def creating_claim(uid: str, name: str, resource: str, token: str, *, start: int, size: int,
                   card: int = 0, at: float | None = None, claim_id: str = "") -> Claim:
    at = time.time() if at is None else at
    return Claim(id=claim_id or f"c-{token}", state="creating", pod_uid=uid, namespace="default",
                 name=name, container="main", resource=resource, device_ids=[token], card=card,
                 profile=resource.removeprefix(MIG), start=start, size=size, created_at=at,
                 updated_at=at)


async def test_token_freed_under_a_running_pod_is_not_taken_for_its_retry(nc, js, node) -> None:
    """Finding 1: kubelet frees a Running Pod's token when its containers stop, before the API
    server says so, and hands it to B. B gets a partition of its own once A is confirmed
    finished; A's claim and instance are never B's."""
    async with node_stack(nc, node) as n:
        a = await n.add_pod("a", {"main": {R7: 1}})
        await n.phase(a, "Running")
        await n.watcher.change(a, phase="Running")  # the watcher saw it start
        [old] = await n.claims_of(a)
        await n.kubelet.finish(a)  # containers stop; the status reaches the API server later
        asked = n.watcher.fresh_asked.count(a)

        b = await n.add_pod("b", {"main": {R7: 1}})
        await until(lambda: n.watcher.fresh_asked.count(a) > asked or n.source.last_report(b),
                    "the allocator asks afresh about the token's holder")
        await n.watcher.finish(a, lag=True)  # A's status reaches the API server
        await n.phase(b, "Running")

        [new] = await n.claims_of(b)
        assert new.state == "active" and new.id != old.id
        assert await n.claims_of(a) == []
        assert n.reclaimer.destroyed == [instance_of(old).uuid]
        served = pod_record(n.kubelet, b).containers["main"].responses[R7]
        assert served.envs["NVIDIA_VISIBLE_DEVICES"] == instance_of(new).uuid


async def test_token_of_a_pod_still_live_is_refused_naming_both_pods(nc, js, node) -> None:
    """Finding 1, other branch: the holder stays live past the room wait: B is refused with a
    sentence naming both Pods, and A's partition is left alone."""
    async with node_stack(nc, node, options=QUICK) as n:
        a = await n.add_pod("a", {"main": {R7: 1}})
        await n.phase(a, "Running")
        await n.watcher.change(a, phase="Running")
        [old] = await n.claims_of(a)
        await n.kubelet.finish(a)

        b = await n.add_pod("b", {"main": {R7: 1}})
        await n.phase(b, "Failed")

        report = n.report(b)
        assert "default/a" in report and "default/b" in report
        assert [c.id for c in await n.claims()] == [old.id]
        assert [i.uuid for i in await n.instances()] == [instance_of(old).uuid]


async def test_older_pod_rejected_before_allocate_is_not_served(nc, js, node) -> None:
    """Finding 2: A (older) was rejected by kubelet before any Allocate while the API server
    still shows it Pending; without pod-resources B's Allocate must not be given to A."""
    async with node_stack(nc, node, pod_resources=False) as n:
        a = new_uid()
        await n.watcher.add(n.watcher.record(a, "a", {"main": {R1: 1}}))  # kubelet rejected it

        async def decided() -> bool:
            return a in n.watcher.fresh_asked or bool(await n.claims())

        b = await n.add_pod("b", {"main": {R1: 1}})
        await until(decided, "the allocator confirms the candidates or decides")
        await n.watcher.change(a, lag=True, phase="Failed", state="finished")
        await n.phase(b, "Running")

        [claim] = await n.claims()
        assert claim.pod_uid == b and claim.state == "active"


async def test_two_pending_candidates_without_pod_resources_are_refused_not_guessed(
    nc, js, node
) -> None:
    async with node_stack(nc, node, options=QUICK, pod_resources=False) as n:
        for name in ("a", "b"):
            await n.watcher.add(n.watcher.record(new_uid(), name, {"main": {R1: 1}}))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await n.allocate(R1, ["1g.10gb-0"])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "default/a" in refused.value.details() and "default/b" in refused.value.details()
        assert await n.claims() == []


async def test_retry_resumes_a_partly_written_group_of_claims(nc, js, node) -> None:
    """Finding 3: a crash between the two claim writes of one container left one `creating`
    claim; kubelet's retry with both device IDs completes the group (invariant 7)."""
    async with node_stack(nc, node, pod_resources=False) as n:
        uid = new_uid()
        await n.watcher.add(n.watcher.record(uid, "pair", {"main": {R3: 2}}))
        first = creating_claim(uid, "pair", R3, "3g.40gb-0", start=0, size=4)
        await n.store.update(0, lambda d: machine.begin(d, first))

        reply = await n.allocate(R3, ["3g.40gb-0", "3g.40gb-1"])

        claims = await n.claims_of(uid)
        assert sorted(t for c in claims for t in c.device_ids) == ["3g.40gb-0", "3g.40gb-1"]
        assert first.id in {c.id for c in claims} and {c.state for c in claims} == {"active"}
        uuids = reply.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert sorted(uuids) == sorted(i.uuid for i in await n.instances())
        assert len(uuids) == 2


async def test_room_held_by_a_stale_creating_claim_of_a_gone_pod_is_reclaimed(
    nc, js, node
) -> None:
    """Finding 4: the room plan and the reclaimer's `reclaim.now` share one definition of
    "reclaimable now", so a crash's leftover `creating` claim of a gone Pod makes room."""
    options = replace(FAST, room_wait_seconds=3.0)
    async with node_stack(nc, node, options=options, pod_resources=False,
                          real_reclaimer=True) as n:
        a = new_uid()
        await n.watcher.add(n.watcher.record(a, "a", {"main": {R7: 1}}))
        await n.watcher.gone(a)
        left = creating_claim(a, "a", R7, "7g.80gb-0", start=0, size=8, at=time.time() - 3600)
        await n.store.update(0, lambda d: machine.begin(d, left))
        n.driver.create(InstanceSpec(0, "7g.80gb", 0))  # the crash came after the create
        b = new_uid()
        await n.watcher.add(n.watcher.record(b, "b", {"main": {R1: 1}}))

        reply = await n.allocate(R1, ["1g.10gb-0"])

        [new] = await n.claims()
        assert new.pod_uid == b and reply.envs["NVIDIA_VISIBLE_DEVICES"] == instance_of(new).uuid
        assert [i.profile for i in await n.instances()] == ["1g.10gb"]


async def test_claim_write_with_an_unknown_outcome_leaves_no_orphan(
    nc, js, node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 5: the server applied a claim write whose reply timed out; the allocator reads
    the card again instead of forgetting the claim it wrote."""
    original = ClaimsStore.update
    timed_out: list[int] = []

    async def reply_lost(self: ClaimsStore, card: int, mutate, **kw):
        written = await original(self, card, mutate, **kw)
        if getattr(mutate, "func", None) is machine.begin and not timed_out:
            timed_out.append(card)
            raise nats.errors.TimeoutError
        return written

    monkeypatch.setattr(ClaimsStore, "update", reply_lost)
    async with node_stack(nc, node) as n:
        a = await n.add_pod("a", {"main": {R1: 1}})
        await until(lambda: n.source.last_report(a) is not None, "kubelet reports the Pod")

        assert timed_out == [0]
        claims = await n.claims()
        assert [c.state for c in claims] == ["active"], n.report(a)
        assert n.report(a).startswith("Running")


async def test_preferred_allocation_avoids_tokens_a_claim_carries(nc, js, node) -> None:
    """kubelet offers a freed token of a stopped Pod along with free ones; the plugin prefers
    the free ones, so the new Pod's Allocate is not mistaken for anything of the old one's."""
    async with node_stack(nc, node) as n:
        a = await n.add_pod("a", {"main": {R1: 1}})
        await n.phase(a, "Running")
        [held] = await n.claims_of(a)
        await n.kubelet.finish(a)  # kubelet frees its token; nobody has told the watcher

        b = await n.add_pod("b", {"main": {R1: 1}})
        await n.phase(b, "Running")

        [claim] = await n.claims_of(b)
        assert claim.device_ids != held.device_ids
        assert [c.id for c in await n.claims_of(a)] == [held.id]


async def test_an_init_containers_partition_is_reused_by_the_app_container(nc, js, node) -> None:
    """kubelet allocates the init container first, then calls Allocate for the app container
    with the same device IDs (its device manager reuses them): one partition serves both."""
    async with node_stack(nc, node) as n:
        a = await n.add_pod("a", {"main": {R3: 1}}, init={"setup": {R3: 1}})
        await n.phase(a, "Running")

        [claim] = await n.claims_of(a)
        assert claim.container == "setup" and claim.state == "active"
        responses = pod_record(n.kubelet, a).containers
        for container in ("setup", "main"):
            envs = responses[container].responses[R3].envs
            assert envs["NVIDIA_VISIBLE_DEVICES"] == instance_of(claim).uuid
        assert [i.uuid for i in await n.instances()] == [instance_of(claim).uuid]


async def test_cancelled_wait_for_the_pod_to_be_told_writes_nothing(nc, js, node) -> None:
    """kubelet giving up on its call ends the wait for several candidates to narrow to one."""
    options = replace(FAST, choose_wait_seconds=30.0)
    async with node_stack(nc, node, options=options, pod_resources=False) as n:
        uids = [new_uid(), new_uid()]
        for uid, name in zip(uids, ("a", "b"), strict=True):
            await n.watcher.add(n.watcher.record(uid, name, {"main": {R1: 1}}))
        call = asyncio.create_task(n.allocate(R1, ["1g.10gb-0"], timeout=60))
        await until(lambda: set(uids) <= set(n.watcher.fresh_asked), "the candidates are asked")
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await until(lambda: not any(t.get_name() == "allocate" for t in asyncio.all_tasks()),
                    "the allocator ends the call")
        await n.watcher.change(uids[0], phase="Failed", state="finished")  # b could now be told
        assert await n.claims() == []


async def test_refusal_says_when_the_profile_mix_cannot_fit(nc, js, node) -> None:
    """kubelet saw a Healthy 7g token beside a running 1g (profiles are advertised apart): the
    refusal says the mix cannot fit, after the configured room wait."""
    async with node_stack(nc, node, options=QUICK, pod_resources=False) as n:
        a = await n.add_pod("a", {"main": {R1: 1}})
        await n.phase(a, "Running")
        b = new_uid()
        await n.watcher.add(n.watcher.record(b, "b", {"main": {R7: 1}}))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await n.allocate(R7, ["7g.80gb-0"])
        message = refused.value.details()
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "for Pod default/b" in message and "Pod default/a" in message
        assert "The profile mix cannot fit on the card: 7g.80gb needs memory slices that live " \
               "1g.10gb partitions hold" in message
        assert [c.pod_uid for c in await n.claims()] == [a]
