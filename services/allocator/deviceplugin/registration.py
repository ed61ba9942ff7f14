"""Serving one plugin socket per resource in PK_KUBELET_DIR and registering with kubelet.

kubelet re-creates `kubelet.sock` when it restarts and deletes the plugins' sockets; a plugin must
then serve again and register again. The standard library has no inotify, so the socket's
identity (device, inode, ctime) is polled about once a second, which is cheap and bounds the
re-registration delay; any change, or a missing plugin socket, re-serves and re-registers.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from partkeeper import backoff
from partkeeper.kubelet import (
    API_VERSION,
    KUBELET_SOCKET,
    deviceplugin_pb2,
    deviceplugin_pb2_grpc,
    open_unix_channel,
    serve_unix,
)
from partkeeper.telemetry.grpc import ServerTracing
from services.allocator.core.catalog import Offer
from services.allocator.deviceplugin.allocate import Allocator
from services.allocator.deviceplugin.plugin import OPTIONS, Board, DevicePlugin

log = logging.getLogger(__name__)

Identity = tuple[int, int, int]
REGISTER_TIMEOUT = 5.0


def identity(path: Path) -> Identity | None:
    """Which socket is at `path` now, or None when there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def endpoint_name(resource: str) -> str:
    """The plugin's socket file name for a resource: one path component, no slash."""
    return "partkeeper-" + resource.replace("/", "_") + ".sock"


@dataclass(eq=False)
class PluginServer:
    """A grpc.aio server for one resource on `<dir>/<endpoint>`."""

    directory: Path
    offer: Offer
    board: Board
    allocator: Allocator
    _server: grpc.aio.Server | None = field(default=None, init=False)
    _servicer: DevicePlugin | None = field(default=None, init=False)
    _identity: Identity | None = field(default=None, init=False)

    @property
    def endpoint(self) -> str:
        return endpoint_name(self.offer.resource)

    @property
    def path(self) -> Path:
        return self.directory / self.endpoint

    async def start(self) -> None:
        servicer = DevicePlugin(self.offer, self.board, self.allocator)
        server = grpc.aio.server(interceptors=[ServerTracing()])
        deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
        await serve_unix(server, self.path)
        # Only kubelet (root) may call Allocate: the socket's mode must not depend on the umask.
        os.chmod(self.path, 0o600)
        self._server, self._servicer = server, servicer
        self._identity = identity(self.path)
        log.info("serving %s on %s", self.offer.resource, self.path)

    async def stop(self) -> None:
        if self._servicer is not None:
            self._servicer.stop.set()
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=0.2)
        if self._identity is not None and identity(self.path) == self._identity:
            self.path.unlink(missing_ok=True)
        self._identity = None

    def intact(self) -> bool:
        """Our socket is still the file at our path (kubelet deletes plugin sockets at start)."""
        return self._server is not None and identity(self.path) == self._identity

    async def ensure_serving(self) -> None:
        if not self.intact():
            await self.stop()
            await self.start()


async def register(kubelet_socket: Path, server: PluginServer) -> None:
    request = deviceplugin_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=server.endpoint,
        resource_name=server.offer.resource,
        options=OPTIONS,
    )
    async with open_unix_channel(kubelet_socket) as channel:
        stub = deviceplugin_pb2_grpc.RegistrationStub(channel)
        await stub.Register(request, timeout=REGISTER_TIMEOUT)


class Registrar:
    """Keeps every plugin served and registered with the kubelet currently at kubelet.sock."""

    def __init__(self, directory: Path, servers: list[PluginServer], poll_seconds: float) -> None:
        self.kubelet_socket = directory / KUBELET_SOCKET
        self.servers = servers
        self.poll_seconds = poll_seconds
        self.registrations = 0  # successful Register calls, for tests and logs
        self.registered = False  # every plugin registered with the kubelet now at kubelet.sock

    async def run(self) -> None:
        """Every `poll_seconds`, register again with a kubelet that is new (its socket's
        identity changed) or whose plugin sockets went away; a failure retries with backoff."""
        registered_with: Identity | None = None

        async def check() -> backoff.Again | None:
            nonlocal registered_with
            current = identity(self.kubelet_socket)
            stale = any(not s.intact() for s in self.servers)
            self.registered = current is not None and current == registered_with and not stale
            if current is None or (current == registered_with and not stale):
                return None
            problem = await self._register_all()
            if problem is not None:
                return backoff.Again(problem)
            self.registered, registered_with = True, current
            return None

        await backoff.every(f"registering with kubelet at {self.kubelet_socket}",
                            self.poll_seconds, check, schedule=backoff.Schedule(0.2, 5.0))

    async def _register_all(self) -> str | None:
        """Serve and register every plugin; what failed, or None when all are registered."""
        for server in self.servers:
            try:
                await server.ensure_serving()
                await register(self.kubelet_socket, server)
            except (grpc.aio.AioRpcError, OSError) as exc:
                return f"registering {server.offer.resource} failed: {exc}"
            self.registrations += 1
            log.info("registered %s with kubelet (endpoint %s)", server.offer.resource,
                     server.endpoint)
        return None

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()


