"""The kubelet device-plugin API v1beta1 for one resource (grpc.aio servicer).

`Board` holds the resource's latest token list; every ListAndWatch stream sends the whole list
again whenever it changes (kubelet keeps only the latest), so a slow stream skips intermediate
lists but never misses the last one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping

import grpc
import grpc.aio

from partkeeper.kubelet import HEALTHY, UNHEALTHY, deviceplugin_pb2, deviceplugin_pb2_grpc
from partkeeper.telemetry import tracing
from services.allocator.core.catalog import Offer
from services.allocator.core.refusal import Refusal, Result
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
