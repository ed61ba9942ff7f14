"""Device plugins as the simulated kubelet sees them: registration, dial-back, the device lists.

`PluginRegistry` serves `Registration` on `<dir>/kubelet.sock`. A Register is answered at once and
the plugin is dialled back afterwards (as kubelet does), so a plugin must be serving before it
registers. The latest `ListAndWatch` list per resource is kept; when a plugin's stream ends its
devices stay known but turn Unhealthy until it registers again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from partkeeper.kubelet import (
    API_VERSION,
    HEALTHY,
    KUBELET_SOCKET,
    PRE_START_TIMEOUT_SECONDS,
    UNHEALTHY,
    UnixServer,
    deviceplugin_pb2,
    deviceplugin_pb2_grpc,
    open_unix_channel,
    wait_ready,
)
from partkeeper.lifecycle import cancel_all
from partkeeper.telemetry.grpc import outgoing_metadata
from partkeeper_sim.kubelet.pods import is_extended_resource

log = logging.getLogger(__name__)

pb = deviceplugin_pb2


class PluginCallError(RuntimeError):
    """A call to a device plugin failed; the message names the resource, the call and the cause."""


class Endpoint:
    """One registered plugin: its channel, options and the last device list it sent."""

    def __init__(self, request: pb.RegisterRequest, socket_path: Path) -> None:
        self.resource = request.resource_name
        self.endpoint = request.endpoint
        self.socket_path = socket_path
        self.options = pb.DevicePluginOptions()
        self.devices: dict[str, str] = {}
        self.connected = False
        self._channel: grpc.aio.Channel | None = None
        self._stub: deviceplugin_pb2_grpc.DevicePluginStub | None = None

    def _require_stub(self) -> deviceplugin_pb2_grpc.DevicePluginStub:
        if self._stub is None or not self.connected:
            raise PluginCallError(f"the plugin for {self.resource} is not connected")
        return self._stub

    async def connect(self, timeout: float) -> None:
        self._channel = open_unix_channel(self.socket_path)
        self._stub = deviceplugin_pb2_grpc.DevicePluginStub(self._channel)
        try:
            await wait_ready(self._channel, timeout)
            self.options = await self._stub.GetDevicePluginOptions(pb.Empty(), timeout=timeout)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            raise PluginCallError(
                f"cannot reach the plugin for {self.resource} at {self.socket_path}: {exc!r}"
            ) from exc
        self.connected = True

    async def watch(self, on_update: Callable[[Endpoint], None]) -> None:
        """Consume ListAndWatch until the stream ends; every response replaces the list."""
        call = self._require_stub().ListAndWatch(pb.Empty())
        try:
            async for response in call:
                self.devices = {d.ID: d.health for d in response.devices}
                on_update(self)
        except grpc.aio.AioRpcError as exc:
            log.warning("ListAndWatch of %s ended: %s", self.resource, exc.code().name)
        finally:
            call.cancel()

    async def preferred(self, available: Sequence[str], size: int) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available), allocation_size=size
                )
            ]
        )
        response = await self._call("GetPreferredAllocation", request)
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    async def allocate(
        self, ids: Sequence[str], timeout: float | None
    ) -> pb.ContainerAllocateResponse:
        container = pb.ContainerAllocateRequest(devices_ids=ids)
        request = pb.AllocateRequest(container_requests=[container])
        response = await self._call("Allocate", request, timeout)
        if len(response.container_responses) != 1:
            raise PluginCallError(
                f"Allocate for {self.resource} answered {len(response.container_responses)} "
                "container responses to 1 container request"
            )
        return response.container_responses[0]

    async def pre_start(self, ids: Sequence[str]) -> None:
        request = pb.PreStartContainerRequest(devices_ids=ids)
        await self._call("PreStartContainer", request, PRE_START_TIMEOUT_SECONDS)

    async def _call(self, method: str, request: object, timeout: float | None = None) -> Any:
        stub = self._require_stub()
        try:
            return await getattr(stub, method)(request, timeout=timeout,
                                               metadata=outgoing_metadata())
        except grpc.aio.AioRpcError as exc:
            raise PluginCallError(
                f"{method} for {self.resource} failed: {exc.code().name}: {exc.details()}"
            ) from exc
        except asyncio.CancelledError:
            # grpc.aio cancels the calls of a channel being closed (the plugin re-registered,
            # the kubelet restarted): that fails this call, as it would in kubelet, but must
            # not end the caller (the sync loop) unless the caller itself is being cancelled.
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            raise PluginCallError(
                f"{method} for {self.resource} failed: its connection to the plugin was closed"
            ) from None

    async def close(self) -> None:
        self.connected = False
        if self._channel is not None:
            await self._channel.close()


class PluginRegistry(deviceplugin_pb2_grpc.RegistrationServicer):
    """The Registration server and the endpoints it has dialled, one per resource."""

    def __init__(
        self,
        kubelet_dir: Path,
        on_change: Callable[[], None],
        *,
        connect_timeout: float = 10.0,
        clean_plugin_sockets: bool = True,
    ) -> None:
        self.kubelet_dir = Path(kubelet_dir)
        self.socket_path = self.kubelet_dir / KUBELET_SOCKET
        self.endpoints: dict[str, Endpoint] = {}
        self.registrations: list[pb.RegisterRequest] = []
        self.connect_errors: list[str] = []
        self._on_change = on_change
        self._connect_timeout = connect_timeout
        self._clean = clean_plugin_sockets
        self._server = UnixServer(
            self.socket_path,
            lambda server: deviceplugin_pb2_grpc.add_RegistrationServicer_to_server(self, server))
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        if self._clean:
            _remove_sockets(self.kubelet_dir)
        await self._server.start()
        log.info("registration server listening on %s", self.socket_path)

    async def stop(self) -> None:
        await self._server.stop()
        # cancel_all cancels again until each has ended: grpc.aio can swallow a cancel that
        # lands in a call (grpc/grpc#43502), and a restart waited for ever on one.
        await cancel_all(self._tasks)
        for endpoint in self.endpoints.values():
            await endpoint.close()
        self.endpoints.clear()
        self._on_change()

    async def restart(self) -> None:
        """Stop, delete kubelet.sock (and plugin sockets, as kubelet does), serve a new one."""
        await self.stop()
        await self.start()

    # -- Registration service --------------------------------------------------------------

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        problem = _registration_problem(request)
        if problem:
            log.warning("refused registration of %r: %s", request.resource_name, problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        self.registrations.append(request)
        task = asyncio.create_task(self._connect(request), name=f"dial {request.resource_name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pb.Empty()

    # -- internals -------------------------------------------------------------------------

    async def _connect(self, request: pb.RegisterRequest) -> None:
        endpoint = Endpoint(request, self.kubelet_dir / request.endpoint)
        try:
            await endpoint.connect(self._connect_timeout)
        except PluginCallError as exc:
            log.warning("%s", exc)
            self.connect_errors.append(str(exc))
            await endpoint.close()
            self._on_change()
            return
        except asyncio.CancelledError:
            await endpoint.close()  # stopped while dialling: the channel must not outlive us
            raise
        old = self.endpoints.get(endpoint.resource)
        if old is not None:
            # The old list stays, Unhealthy, until the new plugin sends its own.
            endpoint.devices = dict.fromkeys(old.devices, UNHEALTHY)
            await old.close()
        self.endpoints[endpoint.resource] = endpoint
        log.info("plugin for %s connected at %s", endpoint.resource, endpoint.socket_path)
        self._on_change()
        await endpoint.watch(lambda _e: self._on_change())
        if self.endpoints.get(endpoint.resource) is endpoint:
            endpoint.devices = dict.fromkeys(endpoint.devices, UNHEALTHY)
            endpoint.connected = False
            self._on_change()

    def healthy(self, resource: str) -> list[str]:
        endpoint = self.endpoints.get(resource)
        if endpoint is None:
            return []
        return [i for i, health in endpoint.devices.items() if health == HEALTHY]


def _registration_problem(request: pb.RegisterRequest) -> str:
    if request.version != API_VERSION:
        return f"version {request.version!r} is not supported; this kubelet speaks {API_VERSION}"
    if not is_extended_resource(request.resource_name):
        return f"{request.resource_name!r} is not an extended resource name"
    if not request.endpoint or os.sep in request.endpoint or request.endpoint in (".", ".."):
        return f"endpoint {request.endpoint!r} must be a file name in the device-plugin dir"
    return ""


def _remove_sockets(directory: Path) -> None:
    """Delete the unix sockets in `directory`, as kubelet clears its plugin dir at start."""
    for entry in directory.iterdir():
        try:
            if stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink()
        except FileNotFoundError:
            continue
