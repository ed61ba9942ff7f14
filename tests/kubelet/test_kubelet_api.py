"""The generated kubelet API modules: wire facts, stubs over a real unix socket, regeneration."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import grpc
import pytest

from partkeeper.kubelet import (
    HEALTHY,
    deviceplugin_pb2,
    deviceplugin_pb2_grpc,
    open_unix_channel,
    podresources_pb2,
    regen,
    unix_target,
)
from tests_support.kubelet import DEADLINE, FakePlugin, healthy, short_tmpdir

pb = deviceplugin_pb2
KUBELET_PKG = Path(regen.__file__).parent

# (message, field, number) as kubelet's v1beta1 and v1 APIs define them.
DEVICE_PLUGIN_FIELDS = [
    ("DevicePluginOptions", "pre_start_required", 1),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2),
    ("RegisterRequest", "version", 1),
    ("RegisterRequest", "endpoint", 2),
    ("RegisterRequest", "resource_name", 3),
    ("RegisterRequest", "options", 4),
    ("ListAndWatchResponse", "devices", 1),
    ("TopologyInfo", "nodes", 1),
    ("NUMANode", "ID", 1),
    ("Device", "ID", 1),
    ("Device", "health", 2),
    ("Device", "topology", 3),
    ("PreStartContainerRequest", "devices_ids", 1),
    ("PreferredAllocationRequest", "container_requests", 1),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3),
    ("PreferredAllocationResponse", "container_responses", 1),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1),
    ("AllocateRequest", "container_requests", 1),
    ("ContainerAllocateRequest", "devices_ids", 1),
    ("CDIDevice", "name", 1),
    ("AllocateResponse", "container_responses", 1),
    ("ContainerAllocateResponse", "envs", 1),
    ("ContainerAllocateResponse", "mounts", 2),
    ("ContainerAllocateResponse", "devices", 3),
    ("ContainerAllocateResponse", "annotations", 4),
    ("ContainerAllocateResponse", "cdi_devices", 5),
    ("Mount", "container_path", 1),
    ("Mount", "host_path", 2),
    ("Mount", "read_only", 3),
    ("DeviceSpec", "container_path", 1),
    ("DeviceSpec", "host_path", 2),
    ("DeviceSpec", "permissions", 3),
]

POD_RESOURCES_FIELDS = [
    ("ListPodResourcesResponse", "pod_resources", 1),
    ("PodResources", "name", 1),
    ("PodResources", "namespace", 2),
    ("PodResources", "containers", 3),
    ("ContainerResources", "name", 1),
    ("ContainerResources", "devices", 2),
    ("ContainerResources", "cpu_ids", 3),
    ("ContainerResources", "memory", 4),
    ("ContainerResources", "dynamic_resources", 5),
    ("ContainerDevices", "resource_name", 1),
    ("ContainerDevices", "device_ids", 2),
    ("ContainerDevices", "topology", 3),
    ("TopologyInfo", "nodes", 1),
    ("NUMANode", "ID", 1),
    ("GetPodResourcesRequest", "pod_name", 1),
    ("GetPodResourcesRequest", "pod_namespace", 2),
    ("GetPodResourcesResponse", "pod_resources", 1),
    ("AllocatableResourcesResponse", "devices", 1),
]


@pytest.mark.parametrize(("message", "name", "number"), DEVICE_PLUGIN_FIELDS)
def test_device_plugin_field_numbers(message: str, name: str, number: int) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.fields_by_name[name].number == number


@pytest.mark.parametrize(("message", "name", "number"), POD_RESOURCES_FIELDS)
def test_pod_resources_field_numbers(message: str, name: str, number: int) -> None:
    descriptor = podresources_pb2.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.fields_by_name[name].number == number


def test_packages_and_method_paths_match_kubelet() -> None:
    assert pb.DESCRIPTOR.package == "v1beta1"
    assert podresources_pb2.DESCRIPTOR.package == "v1"
    services = {
        s.full_name: sorted(m.name for m in s.methods)
        for d in (pb.DESCRIPTOR, podresources_pb2.DESCRIPTOR)
        for s in d.services_by_name.values()
    }
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": sorted(
            [
                "GetDevicePluginOptions",
                "ListAndWatch",
                "GetPreferredAllocation",
                "Allocate",
                "PreStartContainer",
            ]
        ),
        "v1.PodResourcesLister": ["Get", "GetAllocatableResources", "List"],
    }


def test_device_encodes_as_kubelet_expects() -> None:
    # field 1 (ID) and field 2 (health), both length-delimited strings
    assert pb.Device(ID="a", health=HEALTHY).SerializeToString() == b"\n\x01a\x12\x07Healthy"


def test_unix_target_is_absolute() -> None:
    assert unix_target("x.sock") == "unix://" + str(Path("x.sock").resolve())
    assert unix_target("/tmp/k/kubelet.sock") == "unix:///tmp/k/kubelet.sock"


async def test_stubs_round_trip_over_a_unix_socket() -> None:
    with short_tmpdir() as directory:
        options = pb.DevicePluginOptions(pre_start_required=True)
        plugin = FakePlugin(directory, healthy("d0", "d1"), options=options)
        plugin.preferred_answer = ["d1"]
        await plugin.serve()
        try:
            async with open_unix_channel(plugin.socket_path) as channel:
                stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
                got = await stub.GetDevicePluginOptions(pb.Empty(), timeout=DEADLINE)
                assert got.pre_start_required and not got.get_preferred_allocation_available

                stream = stub.ListAndWatch(pb.Empty(), timeout=DEADLINE)
                first = await stream.read()
                assert [(d.ID, d.health) for d in first.devices] == [
                    ("d0", HEALTHY),
                    ("d1", HEALTHY),
                ]
                stream.cancel()

                request = pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["d0", "d1"], allocation_size=1
                )
                preferred = await stub.GetPreferredAllocation(
                    pb.PreferredAllocationRequest(container_requests=[request]), timeout=DEADLINE
                )
                assert list(preferred.container_responses[0].deviceIDs) == ["d1"]

                allocate = pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["d1"])]
                )
                response = await stub.Allocate(allocate, timeout=DEADLINE)
                container = response.container_responses[0]
                assert dict(container.envs) == {"FAKE_VISIBLE_DEVICES": "d1"}
                assert container.mounts[0].read_only
                assert container.devices[0].container_path == "/dev/d1"
                assert dict(container.annotations) == {"fake/ids": "d1"}

                await stub.PreStartContainer(
                    pb.PreStartContainerRequest(devices_ids=["d1"]), timeout=DEADLINE
                )
                assert plugin.pre_start_calls == [["d1"]]
        finally:
            await plugin.stop()


async def test_plugin_errors_arrive_as_grpc_status() -> None:
    with short_tmpdir() as directory:
        plugin = FakePlugin(directory, healthy("d0"))
        plugin.allocate_error = "no room on any card"
        await plugin.serve()
        try:
            async with open_unix_channel(plugin.socket_path) as channel:
                stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Allocate(pb.AllocateRequest(), timeout=DEADLINE)
                assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert caught.value.details() == "no room on any card"
        finally:
            await plugin.stop()


@pytest.mark.parametrize(
    "name",
    [
        "deviceplugin_pb2.py",
        "deviceplugin_pb2_grpc.py",
        "podresources_pb2.py",
        "podresources_pb2_grpc.py",
    ],
)
def test_checked_in_modules_carry_no_version_guard(name: str) -> None:
    text = (KUBELET_PKG / name).read_text(encoding="utf-8")
    for guard in ("_runtime_version", "GRPC_GENERATED_VERSION", "_registered_method"):
        assert guard not in text


def test_compat_strips_generator_guards() -> None:
    pb2 = (
        "from google.protobuf import descriptor as _descriptor\n"
        "from google.protobuf import runtime_version as _runtime_version\n"
        "_runtime_version.ValidateProtobufRuntimeVersion(\n"
        "    _runtime_version.Domain.PUBLIC,\n    7,\n    35,\n    1,\n    '',\n    'x.proto'\n)\n"
        "DESCRIPTOR = 1\n"
    )
    assert regen.compat("x_pb2.py", pb2) == (
        "from google.protobuf import descriptor as _descriptor\nDESCRIPTOR = 1\n"
    )
    grpc_text = (
        "import grpc\n"
        "GRPC_GENERATED_VERSION = '1.85.1'\n"
        "if _version_not_supported:\n    raise RuntimeError(\n        'x'\n    )\n"
        "        self.Register = channel.unary_unary(\n"
        "                '/v1beta1.Registration/Register',\n"
        "                _registered_method=True)\n"
        "    server.add_registered_method_handlers('v1beta1.Registration', handlers)\n"
    )
    assert regen.compat("x_pb2_grpc.py", grpc_text) == (
        "import grpc\n"
        "        self.Register = channel.unary_unary(\n"
        "                '/v1beta1.Registration/Register')\n"
    )


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="needs grpcio-tools")
def test_checked_in_modules_match_the_protos() -> None:
    with short_tmpdir() as out:
        written = regen.regenerate(out)
        assert sorted(p.name for p in written) == sorted(
            p.name
            for p in KUBELET_PKG.iterdir()
            if "_pb2" in p.name and p.suffix in {".py", ".pyi"}
        )
        for path in written:
            assert path.read_text() == (KUBELET_PKG / path.name).read_text(), path.name
