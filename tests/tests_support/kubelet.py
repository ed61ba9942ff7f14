"""Test peers for the simulated kubelet: a real device-plugin gRPC server and a running kubelet.

`FakePlugin` is a device plugin written against the generated API, served on a unix socket; it
records every call and can be told to fail or to hold an Allocate. Async context managers are
used instead of async fixtures so every object lives on the test's own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from partkeeper.kubelet import (
    API_VERSION,
    HEALTHY,
    KUBELET_SOCKET,
    deviceplugin_pb2,
    deviceplugin_pb2_grpc,
    open_unix_channel,
    unix_target,
)
from partkeeper_sim.kubelet import (
    MemoryPodSource,
    PhaseReport,
    PodRecord,
    PodState,
    PodView,
    SimKubelet,
)
from tests_support import short_tmpdir

pb = deviceplugin_pb2
DEADLINE = 10.0  # seconds any awaited condition may take before the test fails
RESOURCE = "example.com/mig-1g.10gb"


class FakePlugin(deviceplugin_pb2_grpc.DevicePluginServicer):
    """A device plugin for one resource with a settable device list."""

    def __init__(
        self,
        directory: Path,
        devices: Mapping[str, str],
        *,
        resource: str = RESOURCE,
        endpoint: str = "fake.sock",
        options: pb.DevicePluginOptions | None = None,
    ) -> None:
        self.directory = directory
        self.resource = resource
        self.endpoint = endpoint
        self.options = options or pb.DevicePluginOptions()
        self.devices = dict(devices)
        self.allocate_calls: list[pb.AllocateRequest] = []
        self.preferred_calls: list[pb.PreferredAllocationRequest] = []
        self.pre_start_calls: list[list[str]] = []
        self.allocate_error: str | None = None
        self.pre_start_error: str | None = None
        self.preferred_answer: list[str] = []
        self.allocate_gate: asyncio.Event | None = None
        self.allocate_entered = asyncio.Event()
        # The host path each device spec names: a device node every Linux host has, so the
        # runtime's check (sim/partkeeper_sim/kubelet/runtime.py) passes unless a test says
        # otherwise.
        self.host_path: Callable[[str], str] = lambda device: "/dev/null"
        self._changed = asyncio.Event()
        self._server: grpc.aio.Server | None = None

    @property
    def socket_path(self) -> Path:
        return self.directory / self.endpoint

    async def serve(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        server = grpc.aio.server()
        deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(unix_target(self.socket_path))
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def register(self, version: str = API_VERSION) -> None:
        async with open_unix_channel(self.directory / KUBELET_SOCKET) as channel:
            stub = deviceplugin_pb2_grpc.RegistrationStub(channel)
            await stub.Register(
                pb.RegisterRequest(
                    version=version,
                    endpoint=self.endpoint,
                    resource_name=self.resource,
                    options=self.options,
                ),
                timeout=DEADLINE,
            )

    def set_devices(self, devices: Mapping[str, str]) -> None:
        self.devices = dict(devices)
        self._changed.set()

    def allocated_ids(self) -> list[list[str]]:
        return [list(r.container_requests[0].devices_ids) for r in self.allocate_calls]

    # -- DevicePlugin service --------------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: object
    ) -> pb.DevicePluginOptions:
        return self.options

    async def ListAndWatch(
        self, request: pb.Empty, context: object
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        while True:
            self._changed.clear()
            yield pb.ListAndWatchResponse(
                devices=[pb.Device(ID=i, health=h) for i, h in self.devices.items()]
            )
            await self._changed.wait()

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: object
    ) -> pb.PreferredAllocationResponse:
        self.preferred_calls.append(request)
        answer = pb.ContainerPreferredAllocationResponse(deviceIDs=self.preferred_answer)
        return pb.PreferredAllocationResponse(container_responses=[answer])

    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        self.allocate_calls.append(request)
        self.allocate_entered.set()
        if self.allocate_gate is not None:
            await self.allocate_gate.wait()
        if self.allocate_error is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.allocate_error)
        return pb.AllocateResponse(
            container_responses=[
                _response(list(c.devices_ids), self.host_path) for c in request.container_requests
            ]
        )

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        self.pre_start_calls.append(list(request.devices_ids))
        if self.pre_start_error is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.pre_start_error)
        return pb.PreStartContainerResponse()


def _response(ids: list[str], host: Callable[[str], str]) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs={"FAKE_VISIBLE_DEVICES": ",".join(ids)},
        mounts=[pb.Mount(container_path="/fake", host_path="/tmp/fake", read_only=True)],
        devices=[
            pb.DeviceSpec(container_path=f"/dev/{i}", host_path=host(i), permissions="rw")
            for i in ids
        ],
        annotations={"fake/ids": ",".join(ids)},
    )


def healthy(*ids: str) -> dict[str, str]:
    return dict.fromkeys(ids, HEALTHY)


@dataclass
class Harness:
    directory: Path
    source: MemoryPodSource
    kubelet: SimKubelet
    plugin: FakePlugin

    @property
    def pod_resources_socket(self) -> Path:
        return self.directory / "pr.sock"

    async def wait_phase(self, uid: str, phase: str) -> None:
        def reported() -> bool:
            report = self.source.last_report(uid)
            return report is not None and report.phase == phase

        await self.source.wait_for(reported, DEADLINE)

    async def wait_devices(self, devices: Mapping[str, str], resource: str = RESOURCE) -> None:
        await self.kubelet.wait_for(lambda: self.kubelet.devices(resource) == devices, DEADLINE)


@contextlib.asynccontextmanager
async def running(
    devices: Mapping[str, str],
    *,
    options: pb.DevicePluginOptions | None = None,
    termination_delay: float = 0.0,
    status_lag: float = 0.0,
    cpu_millis: int | None = None,
) -> AsyncIterator[Harness]:
    """A started kubelet with one registered FakePlugin whose device list it has received."""
    with short_tmpdir() as directory:
        source = MemoryPodSource()
        kubelet = SimKubelet(
            directory / "dp",
            source,
            pod_resources_socket=directory / "pr.sock",
            termination_delay=termination_delay,
            status_lag=status_lag,
            cpu_millis=cpu_millis,
        )
        await kubelet.start()
        plugin = FakePlugin(directory / "dp", devices, options=options)
        harness = Harness(directory, source, kubelet, plugin)
        try:
            await plugin.serve()
            await plugin.register()
            await harness.wait_devices(dict(devices))
            yield harness
        finally:
            await kubelet.stop()
            await plugin.stop()


def pod_record(kubelet: SimKubelet, uid: str) -> PodRecord:
    """The kubelet's record of Pod `uid`, failing the test when the kubelet has none (it never
    saw the Pod, or forgot it)."""
    record = kubelet.record(uid)
    if record is None:
        raise AssertionError(f"the kubelet has no record of Pod {uid}")
    return record


def last_report(source: MemoryPodSource, uid: str) -> PhaseReport:
    """The last phase the kubelet reported for Pod `uid`, failing the test when it reported
    none."""
    report = source.last_report(uid)
    if report is None:
        raise AssertionError(f"the kubelet reported no phase for Pod {uid}")
    return report


def source_pod(source: MemoryPodSource, uid: str) -> PodView:
    """Pod `uid` as the pod source (the API server's side) holds it, failing the test when it
    is gone."""
    pod = source.pod(uid)
    if pod is None:
        raise AssertionError(f"the pod source has no Pod {uid}")
    return pod


def is_state(h: Harness, uid: str, wanted: PodState) -> bool:
    record = h.kubelet.record(uid)
    return record is not None and record.state is wanted


def state(h: Harness, uid: str) -> PodState:
    return pod_record(h.kubelet, uid).state
