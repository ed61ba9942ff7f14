"""A node reboot on the whole stack (docs/operations.md, "After a reboot"): the services stopped,
`partkeeper sim reboot`, a new boot id under the simulated host's `PK_PROC_ROOT`, the services
started again; and the restarted kubelet's calls, made here through the allocator's real gRPC
sockets.

Why the test makes kubelet's calls: the simulated kubelet keeps no checkpoint across its own
process (sim/partkeeper_sim/kubelet/kubelet.py adopts a running Pod "without devices"), and a real
kubelet's device IDs for a container come from its checkpoint (`kubelet_internal_checkpoint`,
pkg/kubelet/cm/devicemanager/checkpoint in kubernetes/kubernetes); its device manager re-issues
`Allocate` when it starts a container it has no cached allocation for, "likely due to a race
during node restart" (`ManagerImpl.GetDeviceRunContainerOptions`,
pkg/kubelet/cm/devicemanager/manager.go). So the test records what kubelet's pod-resources API
lists for each running container before the reboot (the checkpoint's device IDs) and, once the
services are back, sends `Allocate` with exactly those IDs to the allocator's device-plugin
socket, or `NodePrepareResources` for the same ResourceClaims to its DRA socket, as kubelet does
when it starts those containers again (issue 43).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Sequence
from typing import Any

from partkeeper import bootid
from partkeeper.claims import ClaimsStore
from partkeeper.drivers.profiles import model
from partkeeper.kubelet import (
    deviceplugin_pb2,
    deviceplugin_pb2_grpc,
    dra_pb2,
    dra_pb2_grpc,
    open_unix_channel,
    podresources_pb2,
    podresources_pb2_grpc,
)
from partkeeper_sim.driver import SimDriver
from partkeeper_sim.stack.launch import SERVICES, proc_root
from services.allocator.deviceplugin.registration import endpoint_name
from services.allocator.dra.plugin import service_socket
from tests_support.rig import Rig

# namespace/name -> container -> resource -> device IDs
Held = dict[str, dict[str, dict[str, list[str]]]]


async def kubelet_devices(rig: Rig) -> Held:
    """What kubelet's pod-resources API lists: the device IDs its checkpoint holds."""
    socket = rig.layout.cluster.pod_resources_socket
    async with open_unix_channel(socket) as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        reply = await stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=5.0)
    held: Held = {}
    for pod in reply.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                if d.device_ids:
                    held.setdefault(f"{pod.namespace}/{pod.name}", {}).setdefault(
                        c.name, {})[d.resource_name] = sorted(d.device_ids)
    return held


async def stop_services(rig: Rig, names: Sequence[str] = SERVICES) -> None:
    for name in names:
        if rig.alive(name):
            await rig.kill(name, signal.SIGTERM)


async def start_services(rig: Rig, names: Sequence[str] = SERVICES) -> None:
    for name in names:
        await rig.restart(name)


def reboot_host(rig: Rig) -> str:
    """`partkeeper sim reboot` as a host reboot does it to the cards, and the host's new boot id.
    Returns the new boot id."""
    SimDriver(rig.layout.cluster.sim_state).reboot()
    new = str(uuid.uuid4())
    bootid.write(proc_root(rig.layout), new)
    return new


async def claims_and_boot(store: ClaimsStore, cards: Sequence[int]) -> dict[int, Any]:
    """Per card, its claims and the boot recorded (a restart may strip the audit outbox, which
    is no change of a claim)."""
    docs = await store.read_all(list(cards))
    return {card: (doc.claims, doc.boot_id) for card, (doc, _) in docs.items()}


def empty_card_free(name: str) -> dict[str, int]:
    """Profile -> instances an empty card of model `name` holds (docs/contract.md section 6)."""
    counts = {}
    for profile, spec in model(name).profiles.items():
        chosen: list[tuple[int, int]] = []
        for start, size in sorted(spec.placements()):
            if all(start + size <= s or s + z <= start for s, z in chosen):
                chosen.append((start, size))
        counts[profile] = len(chosen)
    return counts


async def allocate(
    rig: Rig, resource: str, ids: list[str]
) -> deviceplugin_pb2.ContainerAllocateResponse:
    """kubelet's `Allocate` for one container, to the allocator's socket for `resource`."""
    socket = rig.stack.config.kubelet_dir / endpoint_name(resource)
    request = deviceplugin_pb2.AllocateRequest(container_requests=[
        deviceplugin_pb2.ContainerAllocateRequest(devices_ids=ids)])
    async with open_unix_channel(socket) as channel:
        stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
        reply = await stub.Allocate(request, timeout=40.0)
    return reply.container_responses[0]


async def prepare(rig: Rig, claims: Sequence[tuple[str, str, str]]
                  ) -> dict[str, dra_pb2.NodePrepareResourceResponse]:
    """kubelet's `NodePrepareResources` for (namespace, uid, name) ResourceClaims."""
    socket = service_socket(rig.stack.config.kubelet_plugins_dir)
    request = dra_pb2.NodePrepareResourcesRequest(claims=[
        dra_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
    async with open_unix_channel(socket) as channel:
        stub = dra_pb2_grpc.DRAPluginStub(channel)
        reply = await stub.NodePrepareResources(request, timeout=40.0)
    return dict(reply.claims)


def visible(response: deviceplugin_pb2.ContainerAllocateResponse) -> str:
    return response.envs["NVIDIA_VISIBLE_DEVICES"]


def instances(rig: Rig) -> dict[str, dict[str, Any]]:
    """MIG UUID -> the sim's instance, with its card."""
    listed = SimDriver(rig.layout.cluster.sim_state).list()
    return {i["uuid"]: {**i, "card": c["index"]} for c in listed["cards"] for i in c["instances"]}

