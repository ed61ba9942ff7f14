"""The service around Allocate: registration and re-registration with kubelet, logical slices,
claims.query, and two allocators racing on one card."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from partkeeper.bus import request
from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers.profiles import overlaps
from partkeeper.kubelet import deviceplugin_pb2, deviceplugin_pb2_grpc, open_unix_channel
from partkeeper.workdir import MARK, sliced_dir
from partkeeper_sim.driver import SimDriver, init_state
from schemas import ClaimsQuery, ClaimsReply
from schemas.names import BUCKET_CLAIMS, BUCKET_PODS, claims_query_subject
from services.allocator.deviceplugin.registration import endpoint_name
from services.allocator.main import serve
from tests_support import instance_of, until
from tests_support.allocator import FAST, MIG, SLICED, node_stack
from tests_support.allocator_peers import TableWatcher
from tests_support.kubelet import pod_record

pb = deviceplugin_pb2
R1 = MIG + "1g.10gb"


async def test_kubelet_restart_leads_to_reregistration(nc, js, node) -> None:
    async with node_stack(nc, node) as n:
        resources = {r.resource_name for r in n.kubelet.registrations}
        assert R1 in resources and MIG + "7g.80gb" in resources
        before = len(n.kubelet.registrations)
        await n.kubelet.restart()  # kubelet.sock re-created, plugin sockets deleted
        await until(lambda: len(n.kubelet.registrations) >= before + len(resources),
                    "every resource registered again")
        await until(lambda: all(n.kubelet.devices(r) for r in resources),
                    "kubelet has every device list again")
        a = await n.add_pod("a", {"main": {R1: 1}})
        await n.phase(a, "Running")


async def test_plugin_api_answers(nc, js, node) -> None:
    async with node_stack(nc, node) as n:
        path = n.config.kubelet_dir / endpoint_name(R1)
        async with open_unix_channel(path) as channel:
            stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
            assert options.get_preferred_allocation_available
            preferred = await stub.GetPreferredAllocation(pb.PreferredAllocationRequest(
                container_requests=[pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["1g.10gb-5", "1g.10gb-2", "1g.10gb-3"],
                    must_include_deviceIDs=["1g.10gb-5"], allocation_size=2)]), timeout=5)
            assert list(preferred.container_responses[0].deviceIDs) == ["1g.10gb-5", "1g.10gb-2"]
            await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["x"]),
                                         timeout=5)
            stream = stub.ListAndWatch(pb.Empty())
            first = await stream.read()
            assert [d.ID for d in first.devices] == [f"1g.10gb-{i}" for i in range(7)]
            stream.cancel()


async def test_logical_slices(nc, js, node) -> None:
    async with node_stack(nc, node, sliced=("A100-40GB",), slices_per_card=4) as n:
        await n.wait_healthy(SLICED, 4)
        a = await n.add_pod("a", {"main": {SLICED: 1}})
        await n.phase(a, "Running")
        [claim] = await n.claims_of(a)
        assert (claim.kind, claim.profile, claim.card, claim.start, claim.size, claim.state) == (
            "slice", "sliced", 1, 0, 1, "active")
        response = pod_record(n.kubelet, a).containers["main"].responses[SLICED]
        card = (await asyncio.to_thread(n.driver.cards))[1]
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == card.uuid
        assert response.envs["PK_SLICE_MEMORY_MIB"] == str(40 * 1024 // 4)
        assert response.envs["PK_SLICE_COMPUTE_PERCENT"] == "25"
        host = sliced_dir(n.config.pods_dir, a, "main")
        limits = json.loads((host / "limits.json").read_bytes())
        assert (limits["memory_mib"], limits["compute_percent"], limits["slices"]) == (
            10240, 25, [4])
        assert (host / "cache").is_dir() and (host / MARK).is_file()
        assert {m.host_path for m in response.mounts} == {str(host / "limits.json"),
                                                          str(host / "cache")}
        assert await n.instances(0) == []  # no driver call for a slice
        await n.wait_healthy(SLICED, 4)  # its own (held) and the three left
        b = await n.add_pod("b", {"main": {SLICED: 2}})
        await n.phase(b, "Running")
        assert sorted(c.start for c in await n.claims_of(b)) == [1, 2]
        await n.wait_healthy(SLICED, 4)  # three held by live Pods, one free


async def test_claims_query(nc, js, node) -> None:
    async with node_stack(nc, node) as n:
        a = await n.add_pod("a", {"main": {R1: 1}})
        b = await n.add_pod("b", {"main": {R1: 1}})
        await n.phase(a, "Running")
        await n.phase(b, "Running")
        subject = claims_query_subject(node)
        mine = await request(nc, subject, ClaimsQuery(pod_uid=a), ClaimsReply)
        assert [c.pod_uid for c in mine.claims] == [a]
        every = await request(nc, subject, ClaimsQuery(), ClaimsReply)
        assert {c.pod_uid for c in every.claims} == {a, b}
        _, revision = await n.store.read(0)
        assert every.revisions == {"0": revision}
        assert (await request(nc, subject, ClaimsQuery(pod_uid="nobody"), ClaimsReply)).claims \
            == []


async def allocate_on(directory: Path, side: str, tokens: list[str]) -> list[str]:
    request_ = pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=tokens)])
    async with open_unix_channel(directory / side / endpoint_name(R1)) as ch:
        reply = await deviceplugin_pb2_grpc.DevicePluginStub(ch).Allocate(request_, timeout=30)
    return reply.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"].split(",")


def start_allocator(nc, directory: Path, side: str, node: str, driver: SimDriver,
                    ready: asyncio.Event) -> asyncio.Task[None]:
    config = Config(node=node, kubelet_dir=directory / side, pods_dir=directory / "pods",
                    pod_resources_socket=directory / "none.sock", driver="sim",
                    sim_state=driver.path)
    options = replace(FAST, driver=driver, room_wait_seconds=5)
    return asyncio.create_task(serve(config, nc, ready=ready, options=options))


async def test_two_allocators_racing_on_one_card_never_overlap(nc, js, node) -> None:
    """Two allocator processes of one node (a bad deployment, or an upgrade overlap) share the
    store and the card; only compare-and-set on the card document keeps them apart."""
    directory = Path(tempfile.mkdtemp(prefix="pk", dir="/tmp"))
    tasks: list[asyncio.Task[None]] = []
    watcher = await TableWatcher(nc, await js.key_value(BUCKET_PODS), node).start()
    try:
        init_state(directory / "sim.json", ["H100-80GB"], [])
        driver = SimDriver(directory / "sim.json")
        # One Pod per quantity (1 + 2 + 4 partitions fill the card), so each Allocate has one
        # candidate: without pod-resources, several would be refused rather than guessed.
        for i, quantity in enumerate((1, 2, 4)):
            await watcher.add(watcher.record(f"00000000-0000-4000-8000-00000000000{i}",
                                             f"p{i}", {"main": {R1: quantity}}))
        readies = [asyncio.Event(), asyncio.Event()]
        tasks = [start_allocator(nc, directory, side, node, driver, ready)
                 for side, ready in zip(("x", "y"), readies, strict=True)]
        await until(lambda: all(r.is_set() for r in readies), "both allocators serve")

        replies = await asyncio.gather(
            allocate_on(directory, "x", ["1g.10gb-0"]),
            allocate_on(directory, "y", ["1g.10gb-1", "1g.10gb-2"]),
            allocate_on(directory, "x", [f"1g.10gb-{i}" for i in range(3, 7)]),
        )
        uuids = [u for reply in replies for u in reply]

        doc, _ = await ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), node).read(0)
        claims = list(doc.claims.values())
        spans = [(c.start, c.size) for c in claims]
        assert len(claims) == 7 and all(c.state == "active" for c in claims)
        assert not any(overlaps(a, b) for i, a in enumerate(spans) for b in spans[i + 1:])
        instances = await asyncio.to_thread(driver.instances, 0)
        assert sorted(i.uuid for i in instances) == sorted(uuids)
        assert {instance_of(c).uuid for c in claims} == set(uuids)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await watcher.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def test_inv9_unreadable_hardware_refuses_and_keeps_the_advertised_lists(
    nc, js, node
) -> None:
    async with node_stack(nc, node, pod_resources=False) as n:
        before = n.devices(R1)
        await n.watcher.add(n.watcher.record("0d1e2f3a-4b5c-4d6e-8f7a-8b9c0d1e2f3a", "b",
                                             {"main": {R1: 1}}))
        n.sim.fail("list", 1000)  # every enumeration fails from now on
        # The allocator plans on its last enumeration while nothing has moved (`state.Views`) and
        # drops it at the first that fails: here the hardware poll's. Two failed mean the first
        # one's result has reached the allocator.
        await until(lambda: n.sim.list()["faults"]["list"]["times"] <= 998,
                    "the hardware poll failed twice")
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await n.allocate(R1, ["1g.10gb-0"])
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "enumerating the cards failed" in refused.value.details()
            assert await n.claims() == []
            assert n.devices(R1) == before  # a failed read is never taken as "no instances"
        finally:
            n.sim.fail("list", 0)
        await n.allocate(R1, ["1g.10gb-0"])
        assert len(await n.claims()) == 1
