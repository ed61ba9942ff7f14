"""kubelet's device-plugin API v1beta1 for one resource: the grpc.aio servicer, the status kubelet
sees for a refusal (`STATUS`), and what a container gets (the `ContainerAllocateResponse` and the
partition descriptor: pure builders, `allocate.py` calls them).

`Board` holds the resource's latest token list; every ListAndWatch stream sends the whole list
again whenever it changes (kubelet keeps only the latest), so a slow stream skips intermediate
lists but never misses the last one.

## What a container gets

Partitions: the container edits the driver gives for them (NVIDIA and the sim:
`NVIDIA_VISIBLE_DEVICES` = the MIG device UUID(s) exactly as the driver reported them, comma
separated in token order, plus, from the nvml driver, the device specs NVIDIA's device plugin
passes; T-Head: device nodes; Hygon: device nodes, mounts and `DMI_MIG_VISIBLE_DEVICE`), `PK_*`
variables describing the partition(s) and, with the CDI strategy, their CDI device names (see
handoff.py). Slices: the container edits the driver gives for the whole cards they sit on
(NVIDIA and the sim's NVIDIA cards: `NVIDIA_VISIBLE_DEVICES` = the card UUIDs, plus, from the nvml
driver, the cards' device specs; T-Head and Hygon: their vendors' nodes, and Hygon's runtime
mount), the limits, and mounts of the limiter file (read-only) and the cache dir, plus the slice
limiter's env and mounts (`PK_SLICE_LIMITER=hami-core`: HAMi-core's, partkeeper/limiter.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

import grpc
import grpc.aio
import msgspec

from partkeeper.drivers import Card
from partkeeper.drivers.base import ContainerEdits
from partkeeper.kubelet import HEALTHY, UNHEALTHY, deviceplugin_pb2, deviceplugin_pb2_grpc
from partkeeper.telemetry import tracing
from schemas import Claim
from services.allocator.core.catalog import Offer
from services.allocator.core.refusal import Refusal, Result

if TYPE_CHECKING:  # allocate.py builds its replies here
    from services.allocator.deviceplugin.allocate import Allocator

pb = deviceplugin_pb2
log = logging.getLogger(__name__)

# The gRPC status kubelet sees for each reason a container request is refused.
STATUS: Mapping[Result, grpc.StatusCode] = {
    Result.FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Result.NO_POD: grpc.StatusCode.FAILED_PRECONDITION,
    Result.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Result.GONE: grpc.StatusCode.ABORTED,
    Result.DRIVER: grpc.StatusCode.UNAVAILABLE,
    Result.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}

OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class Board:
    """The latest health of a resource's tokens, with a version streams wait on."""

    def __init__(self, tokens: tuple[str, ...]) -> None:
        self.health: dict[str, bool] = dict.fromkeys(tokens, False)
        self.version = 0
        self._changed = asyncio.Event()

    def post(self, health: Mapping[str, bool]) -> bool:
        """Replace the list; True when it differs (then every stream sends it)."""
        if dict(health) == self.health:
            return False
        self.health = dict(health)
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    def response(self) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse(devices=[
            pb.Device(ID=token, health=HEALTHY if ok else UNHEALTHY)
            for token, ok in self.health.items()
        ])

    async def stream(self, stop: asyncio.Event) -> AsyncIterator[pb.ListAndWatchResponse]:
        while not stop.is_set():
            changed = self._changed
            yield self.response()
            waiter = asyncio.ensure_future(changed.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                stopper.cancel()


class DevicePlugin(deviceplugin_pb2_grpc.DevicePluginServicer):
    def __init__(self, offer: Offer, board: Board, allocator: Allocator) -> None:
        self.offer = offer
        self.board = board
        self.allocator = allocator
        self.stop = asyncio.Event()  # set when this server is replaced or shut down
        self._tracer = tracing.tracer(__name__)

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        async for response in self.board.stream(self.stop):
            yield response

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        held = await self.allocator.carried(self.offer.resource)
        return pb.PreferredAllocationResponse(container_responses=[
            pb.ContainerPreferredAllocationResponse(deviceIDs=self._prefer(r, held))
            for r in request.container_requests
        ])

    def _prefer(
        self, request: pb.ContainerPreferredAllocationRequest, held: frozenset[str]
    ) -> list[str]:
        """The must-include IDs, then the lowest available ones that no claim carries, then the
        rest: a carried token kubelet offers was freed under a stopped Pod, and handing it on
        makes the next Allocate ask whether that Pod is really done (docs/allocator.md)."""
        rank = {t: i for i, t in enumerate(self.offer.tokens)}
        chosen = list(dict.fromkeys(request.must_include_deviceIDs))
        for token in sorted(request.available_deviceIDs,
                            key=lambda t: (t in held, rank.get(t, len(rank)))):
            if len(chosen) >= request.allocation_size:
                break
            if token not in chosen:
                chosen.append(token)
        return chosen[: max(request.allocation_size, len(request.must_include_deviceIDs))]

    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        responses: list[pb.ContainerAllocateResponse] = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            with self._tracer.start_as_current_span(
                "Allocate", attributes={"pk.resource": self.offer.resource,
                                        "pk.device_ids": ",".join(ids)}
            ):
                try:
                    responses.append(await self.allocator.allocate(self.offer, ids))
                except Refusal as exc:
                    await context.abort(STATUS[exc.result], exc.message)
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class PartitionDescriptor(msgspec.Struct, frozen=True, kw_only=True):
    """`partition-<MIG uuid>.json`: which claim and Pod a partition belongs to (the allocator
    writes it, the reclaimer removes it after the destroy)."""

    claim_id: str
    pod_uid: str
    namespace: str
    name: str
    container: str
    resource: str
    card: int
    card_uuid: str
    profile: str
    start: int
    size: int
    gi_id: int
    ci_id: int
    uuid: str
    created_at: float


def descriptor(claim: Claim, card: Card) -> PartitionDescriptor:
    if claim.instance is None:
        raise ValueError(f"claim {claim.id} has no instance to describe")
    return PartitionDescriptor(
        claim_id=claim.id, pod_uid=claim.pod_uid, namespace=claim.namespace, name=claim.name,
        container=claim.container, resource=claim.resource, card=claim.card, card_uuid=card.uuid,
        profile=claim.profile, start=claim.start, size=claim.size, gi_id=claim.instance.gi_id,
        ci_id=claim.instance.ci_id, uuid=claim.instance.uuid, created_at=claim.created_at,
    )


def partition_response(
    claims: Sequence[Claim], edits: ContainerEdits, cdi_names: Sequence[str] = ()
) -> pb.ContainerAllocateResponse:
    uuids = []
    for c in claims:
        if c.instance is None:
            raise ValueError("every claim must be active with an instance before replying")
        uuids.append(c.instance.uuid)
    first = claims[0]
    envs = {
        **edits.env,
        "PK_RESOURCE": first.resource,
        "PK_PARTITION_PROFILE": first.profile,
        "PK_PARTITION_UUIDS": ",".join(uuids),
        "PK_PARTITION_CARDS": ",".join(str(c.card) for c in claims),
        "PK_PARTITION_PLACEMENTS": ",".join(f"{c.start}+{c.size}" for c in claims),
        "PK_CLAIM_IDS": ",".join(c.id for c in claims),
        "PK_POD_UID": first.pod_uid,
    }
    cdi_devices = [pb.CDIDevice(name=name) for name in cdi_names]
    return pb.ContainerAllocateResponse(envs=envs, devices=_devices(edits), mounts=_mounts(edits),
                                        cdi_devices=cdi_devices)


def _devices(edits: ContainerEdits) -> list[pb.DeviceSpec]:
    return [pb.DeviceSpec(container_path=n.container_path, host_path=n.host_path,
                          permissions=n.permissions) for n in edits.devices]


def _mounts(edits: ContainerEdits) -> list[pb.Mount]:
    return [pb.Mount(container_path=m.container_path, host_path=m.host_path,
                     read_only=m.read_only) for m in edits.mounts]


def slice_response(
    edits: ContainerEdits, cdi_names: Sequence[str] = ()
) -> pb.ContainerAllocateResponse:
    """The reply of a slice container from its `slices.slice_edits`."""
    return pb.ContainerAllocateResponse(
        envs=dict(edits.env), devices=_devices(edits), mounts=_mounts(edits),
        cdi_devices=[pb.CDIDevice(name=name) for name in cdi_names],
    )
