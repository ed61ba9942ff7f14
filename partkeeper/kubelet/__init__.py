"""The kubelet's gRPC APIs: device-plugin v1beta1 and pod-resources v1, plus unix-socket helpers.

The message and stub modules are generated (`python -m partkeeper.kubelet.regen`) and checked in:
`deviceplugin_pb2`, `deviceplugin_pb2_grpc`, `podresources_pb2`, `podresources_pb2_grpc`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import grpc.aio

from partkeeper.kubelet import (
    deviceplugin_pb2,
    deviceplugin_pb2_grpc,
    podresources_pb2,
    podresources_pb2_grpc,
)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEFAULT_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# kubelet bounds PreStartContainer by 30 s; plugins see the same budget here.
PRE_START_TIMEOUT_SECONDS = 30.0

ChannelOptions = Sequence[tuple[str, str | int]]

__all__ = [
    "API_VERSION",
    "DEFAULT_DEVICE_PLUGIN_DIR",
    "DEFAULT_POD_RESOURCES_SOCKET",
    "HEALTHY",
    "KUBELET_SOCKET",
    "PRE_START_TIMEOUT_SECONDS",
    "UNHEALTHY",
    "UnixServer",
    "deviceplugin_pb2",
    "deviceplugin_pb2_grpc",
    "open_unix_channel",
    "podresources_pb2",
    "podresources_pb2_grpc",
    "serve_unix",
    "unix_target",
    "wait_ready",
]


def unix_target(path: str | os.PathLike[str]) -> str:
    """The gRPC target for a unix socket: `unix://` + the absolute path."""
    return "unix://" + os.path.abspath(os.fspath(path))


async def serve_unix(server: grpc.aio.Server, path: Path) -> None:
    """Start `server` on the unix socket at `path`: its directory made, and a socket file a
    previous run left there removed first (binding over it would fail)."""
    _clear_socket(path)
    server.add_insecure_port(unix_target(path))
    await server.start()


def _clear_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)


class UnixServer:
    """A grpc.aio server of the servicers `add` installs, on the unix socket at `path`; `stop`
    removes the socket too, so a stopped server leaves no file a client could dial."""

    def __init__(self, path: Path, add: Callable[[grpc.aio.Server], None]) -> None:
        self.path = path
        self._add = add
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        self._add(server)
        await serve_unix(server, self.path)
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=None)
        self.path.unlink(missing_ok=True)


def open_unix_channel(
    path: str | os.PathLike[str], *, options: ChannelOptions = ()
) -> grpc.aio.Channel:
    """An insecure grpc.aio channel to the unix socket at `path` (connects lazily)."""
    return grpc.aio.insecure_channel(unix_target(path), options=list(options))


async def wait_ready(channel: grpc.aio.Channel, timeout: float) -> None:
    """Wait until `channel` is connected; raises TimeoutError after `timeout` seconds."""
    await asyncio.wait_for(channel.channel_ready(), timeout)
