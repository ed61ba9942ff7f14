"""The pod-resources v1 service of the simulated kubelet, read through the generated client."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from partkeeper.kubelet import open_unix_channel, podresources_pb2, podresources_pb2_grpc
from partkeeper_sim.kubelet import PodState, pod_manifest
from tests_support.kubelet import (
    DEADLINE,
    RESOURCE,
    Harness,
    healthy,
    is_state,
    running,
)

pb = podresources_pb2


async def list_pods(h: Harness) -> dict[str, dict[str, dict[str, list[str]]]]:
    """Pod name -> container -> resource -> device IDs, as the List call reports them."""
    async with open_unix_channel(h.pod_resources_socket) as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        response = await stub.List(pb.ListPodResourcesRequest(), timeout=DEADLINE)
    return {
        p.name: {
            c.name: {d.resource_name: list(d.device_ids) for d in c.devices} for c in p.containers
        }
        for p in response.pod_resources
    }


async def test_list_reports_the_devices_assigned_per_container() -> None:
    async with running(healthy("d0", "d1", "d2")) as h:
        h.source.add(pod_manifest("a", "uid-a", {"x": {RESOURCE: 1}, "y": {RESOURCE: 2}}))
        h.source.add(pod_manifest("plain", "uid-plain", {"main": {}}))
        await h.wait_phase("uid-plain", "Running")
        assert await list_pods(h) == {
            "a": {"x": {RESOURCE: ["d0"]}, "y": {RESOURCE: ["d1", "d2"]}},
            "plain": {"main": {}},
        }


async def test_a_container_being_allocated_is_listed_without_devices() -> None:
    async with running(healthy("d0", "d1")) as h:
        h.plugin.allocate_gate = asyncio.Event()
        h.source.add(pod_manifest("a", "uid-a", {"x": {RESOURCE: 1}, "y": {RESOURCE: 1}}))
        await asyncio.wait_for(h.plugin.allocate_entered.wait(), DEADLINE)
        assert await list_pods(h) == {"a": {"x": {}, "y": {}}}
        h.plugin.allocate_gate.set()
        await h.wait_phase("uid-a", "Running")
        assert await list_pods(h) == {"a": {"x": {RESOURCE: ["d0"]}, "y": {RESOURCE: ["d1"]}}}


async def test_only_active_pods_are_listed() -> None:
    """kubelet lists active Pods only (kubernetes PR 79409): a finished or rejected Pod is not
    listed even while its object, and its lagging status, remain."""
    async with running(healthy("d0")) as h:
        h.kubelet.status_lag = 30.0  # nothing below reaches the API server during the test
        h.source.add(pod_manifest("a", "uid-a", {"main": {RESOURCE: 1}}))
        h.source.add(pod_manifest("b", "uid-b", {"main": {RESOURCE: 1}}))  # no device left
        await h.kubelet.wait_for(lambda: is_state(h, "uid-b", PodState.REJECTED), DEADLINE)
        assert await list_pods(h) == {"a": {"main": {RESOURCE: ["d0"]}}}
        await h.kubelet.finish("uid-a")
        assert await list_pods(h) == {}
        assert h.source.last_report("uid-a") is None  # the API server has heard nothing yet


async def test_init_containers_are_not_listed() -> None:
    async with running(healthy("d0")) as h:
        h.source.add(pod_manifest("a", "uid-a", {"main": {RESOURCE: 1}},
                                  init={"setup": {RESOURCE: 1}}))
        await h.wait_phase("uid-a", "Running")
        assert await list_pods(h) == {"a": {"main": {RESOURCE: ["d0"]}}}


async def test_get_and_allocatable() -> None:
    async with running(healthy("d1", "d0")) as h:
        h.source.add(pod_manifest("a", "uid-a", {"main": {RESOURCE: 1}}, namespace="team"))
        await h.wait_phase("uid-a", "Running")
        async with open_unix_channel(h.pod_resources_socket) as channel:
            stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
            got = await stub.Get(
                pb.GetPodResourcesRequest(pod_name="a", pod_namespace="team"), timeout=DEADLINE
            )
            assert got.pod_resources.containers[0].devices[0].device_ids == ["d0"]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Get(
                    pb.GetPodResourcesRequest(pod_name="a", pod_namespace="default"),
                    timeout=DEADLINE,
                )
            assert caught.value.code() is grpc.StatusCode.NOT_FOUND
            allocatable = await stub.GetAllocatableResources(
                pb.AllocatableResourcesRequest(), timeout=DEADLINE
            )
            assert [(d.resource_name, list(d.device_ids)) for d in allocatable.devices] == [
                (RESOURCE, ["d0", "d1"])
            ]
