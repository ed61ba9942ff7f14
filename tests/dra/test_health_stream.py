"""The DRA plugin's resource-health stream over real gRPC on its service socket: every version a
kubelet may ask for, the complete list at once, a card's XID and its recovery within a second."""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

import pytest

from partkeeper.dra import devices
from partkeeper.kubelet import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_health_v1beta1_pb2,
    dra_health_v1beta1_pb2_grpc,
    dra_registration_pb2,
    dra_registration_pb2_grpc,
    open_unix_channel,
)
from tests_support.dra import dra_node

VERSIONS = [(dra_health_v1_pb2, dra_health_v1_pb2_grpc),
            (dra_health_v1beta1_pb2, dra_health_v1beta1_pb2_grpc),
            (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc)]


async def test_registration_lists_every_health_version(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        async with open_unix_channel(stack.registration_socket) as channel:
            stub = dra_registration_pb2_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(dra_registration_pb2.InfoRequest())
        assert list(info.supported_versions) == [
            "v1.DRAPlugin", "v1.DRAResourceHealth", "v1beta1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"]


async def _next(stream: Any, within: float) -> Any:
    return await asyncio.wait_for(stream.read(), within)


@pytest.mark.parametrize(("pb2", "pb2_grpc"), VERSIONS, ids=["v1", "v1beta1", "v1alpha1"])
async def test_the_stream_lists_every_device_and_follows_an_xid(
    nc, js, node, kubeconfig, pb2: ModuleType, pb2_grpc: ModuleType
) -> None:
    async with dra_node(nc, node, kubeconfig, cards=("H100-80GB", "H100-80GB")) as stack:
        cards = await asyncio.to_thread(stack.driver.cards)
        every = [d.name for d in devices.all_devices(cards)]
        async with open_unix_channel(stack.service_socket) as channel:
            stream = pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                pb2.NodeWatchResourcesRequest())
            first = await _next(stream, 5.0)
            assert [d.device.device_name for d in first.devices] == every
            assert {d.device.pool_name for d in first.devices} == {node}
            assert {d.health for d in first.devices} == {pb2.HEALTHY}

            await asyncio.to_thread(stack.driver.fail_card, 1, 48)
            failed = await _next(stream, 1.0)  # within a second of the card's event
            health = {d.device.device_name: d for d in failed.devices}
            assert [d.device.device_name for d in failed.devices] == every
            assert {health[n].health for n in every if n.startswith("gpu-1-")} == {
                pb2.UNHEALTHY}
            assert {health[n].health for n in every if n.startswith("gpu-0-")} == {pb2.HEALTHY}
            if "message" in pb2.DeviceHealth.DESCRIPTOR.fields_by_name:
                assert "card 1" in health["gpu-1-mig-7g80gb-0"].message
                assert "XID 48" in health["gpu-1-mig-7g80gb-0"].message

            await asyncio.to_thread(stack.driver.recover_card, 1)
            recovered = await _next(stream, 1.0)
            assert {d.health for d in recovered.devices} == {pb2.HEALTHY}
            stream.cancel()
