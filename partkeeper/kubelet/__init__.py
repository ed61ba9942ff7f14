"""The kubelet's gRPC APIs: device-plugin v1beta1 and pod-resources v1, plus unix-socket helpers.

The message and stub modules are generated (`python -m partkeeper.kubelet.regen`) and checked in:
`deviceplugin_pb2`, `deviceplugin_pb2_grpc`, `podresources_pb2`, `podresources_pb2_grpc`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
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
    "deviceplugin_pb2",
    "deviceplugin_pb2_grpc",
    "open_unix_channel",
    "podresources_pb2",
    "podresources_pb2_grpc",
    "unix_target",
    "wait_ready",
]


def unix_target(path: str | os.PathLike[str]) -> str:
    """The gRPC target for a unix socket: `unix://` + the absolute path."""
    return "unix://" + os.path.abspath(os.fspath(path))


def open_unix_channel(
    path: str | os.PathLike[str], *, options: ChannelOptions = ()
) -> grpc.aio.Channel:
    """An insecure grpc.aio channel to the unix socket at `path` (connects lazily)."""
    return grpc.aio.insecure_channel(unix_target(path), options=list(options))


async def wait_ready(channel: grpc.aio.Channel, timeout: float) -> None:
    """Wait until `channel` is connected; raises TimeoutError after `timeout` seconds."""
    await asyncio.wait_for(channel.channel_ready(), timeout)
