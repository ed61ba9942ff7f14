"""The pod-resources v1 service of the simulated kubelet, on its own unix socket.

Reports, per Pod the kubelet knows, each container and the device IDs assigned to it per
resource. As in kubelet, a container's devices appear once its Allocate has succeeded, so while
an Allocate is in flight the container it serves is listed without devices of that resource.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from partkeeper.kubelet import UnixServer, podresources_pb2, podresources_pb2_grpc

log = logging.getLogger(__name__)

pb = podresources_pb2


@dataclass(frozen=True, slots=True)
class PodAssignment:
    """A Pod as the pod-resources API shows it: container name -> resource -> device IDs."""

    namespace: str
    name: str
    containers: Mapping[str, Mapping[str, Sequence[str]]]


def to_message(pod: PodAssignment) -> pb.PodResources:
    return pb.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            pb.ContainerResources(
                name=cname,
                devices=[
                    pb.ContainerDevices(resource_name=resource, device_ids=list(ids))
                    for resource, ids in sorted(devices.items())
                ],
            )
            for cname, devices in pod.containers.items()
        ],
    )


class PodResourcesServer(podresources_pb2_grpc.PodResourcesListerServicer):
    """Answers from `snapshot()` (Pods) and `allocatable()` (resource -> Healthy device IDs)."""

    def __init__(
        self,
        socket_path: Path,
        snapshot: Callable[[], Sequence[PodAssignment]],
        allocatable: Callable[[], Mapping[str, Sequence[str]]],
    ) -> None:
        self.socket_path = Path(socket_path)
        self._snapshot = snapshot
        self._allocatable = allocatable
        self._server = UnixServer(
            self.socket_path,
            lambda server: podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(
                self, server))

    async def start(self) -> None:
        await self._server.start()
        log.info("pod-resources server listening on %s", self.socket_path)

    async def stop(self) -> None:
        await self._server.stop()

    async def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        return pb.ListPodResourcesResponse(pod_resources=[to_message(p) for p in self._snapshot()])

    async def Get(
        self, request: pb.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPodResourcesResponse:
        for pod in self._snapshot():
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return pb.GetPodResourcesResponse(pod_resources=to_message(pod))
        await context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"pod {request.pod_namespace}/{request.pod_name} not found on this node",
        )
        raise AssertionError("abort returned")  # pragma: no cover - abort always raises

    async def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocatableResourcesResponse:
        return pb.AllocatableResourcesResponse(
            devices=[
                pb.ContainerDevices(resource_name=resource, device_ids=list(ids))
                for resource, ids in sorted(self._allocatable().items())
            ]
        )
