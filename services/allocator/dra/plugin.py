"""The kubelet plugin of DRA mode: two unix sockets, both served by grpc.aio.

    <PK_KUBELET_REGISTRY_DIR>/partitions.partkeeper.io-reg.sock   plugin registration v1
        GetInfo -> type "DRAPlugin", the driver name, the service socket, ["v1.DRAPlugin"]
    <PK_KUBELET_PLUGINS_DIR>/partitions.partkeeper.io/dra.sock     k8s.io.kubelet...dra.v1.DRAPlugin
        and DRAResourceHealth v1, v1beta1, v1alpha1 (health.py), listed in supported_versions

Kubelet's plugin watcher finds the registration socket in its directory, asks GetInfo, dials
the service socket and reports back through NotifyRegistrationStatus. Both sockets are owner
only: kubelet runs as root, nothing else may prepare a claim.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from partkeeper.dra import DRIVER
from partkeeper.kubelet import (
    dra_pb2,
    dra_pb2_grpc,
    dra_registration_pb2,
    dra_registration_pb2_grpc,
    serve_unix,
)
from partkeeper.telemetry.grpc import ServerTracing
from services.allocator.dra import health
from services.allocator.dra.prepare import Preparer

T = TypeVar("T")

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", *health.SERVICES)


def registration_socket(registry_dir: Path) -> Path:
    return registry_dir / f"{DRIVER}-reg.sock"


def service_socket(plugins_dir: Path) -> Path:
    return plugins_dir / DRIVER / "dra.sock"


class DraService(dra_pb2_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def NodePrepareResources(
        self, request: dra_pb2.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_pb2.NodePrepareResourcesResponse:
        return dra_pb2.NodePrepareResourcesResponse(
            claims=await _each(request.claims, self.preparer.prepare))

    async def NodeUnprepareResources(
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        return dra_pb2.NodeUnprepareResourcesResponse(
            claims=await _each(request.claims, self.preparer.unprepare))


async def _each(claims: Sequence[Any], handle: Callable[[Any], Awaitable[T]]) -> dict[str, T]:
    """Every claim of one kubelet call handled concurrently, answered by claim UID."""
    answers = await asyncio.gather(*(handle(c) for c in claims))
    return {c.uid: a for c, a in zip(claims, answers, strict=True)}


class Registration(dra_registration_pb2_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self.registered = asyncio.Event()

    async def GetInfo(
        self, request: dra_registration_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> dra_registration_pb2.PluginInfo:
        return dra_registration_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_VERSIONS))

    async def NotifyRegistrationStatus(
        self, request: dra_registration_pb2.RegistrationStatus,
        context: grpc.aio.ServicerContext,
    ) -> dra_registration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("kubelet registered the DRA plugin %s", DRIVER)
            self.registered.set()
        else:
            log.error("kubelet refused the DRA plugin %s: %s", DRIVER, request.error)
            self.registered.clear()
        return dra_registration_pb2.RegistrationStatusResponse()


class KubeletPlugin:
    def __init__(self, registry_dir: Path, plugins_dir: Path, preparer: Preparer,
                 feed: health.HealthFeed | None = None) -> None:
        self.feed = feed
        self.service_path = service_socket(plugins_dir)
        self.registration_path = registration_socket(registry_dir)
        self.registration = Registration(self.service_path)
        self.preparer = preparer
        self._servers: list[grpc.aio.Server] = []

    async def start(self) -> None:
        """Serve the DRA service first, then the registration socket kubelet looks for."""
        service = grpc.aio.server(interceptors=[ServerTracing()])
        dra_pb2_grpc.add_DRAPluginServicer_to_server(DraService(self.preparer), service)
        if self.feed is not None:
            health.add_to_server(service, self.feed)
        await _serve(service, self.service_path)
        self._servers.append(service)
        registration = grpc.aio.server()
        dra_registration_pb2_grpc.add_RegistrationServicer_to_server(self.registration,
                                                                     registration)
        await _serve(registration, self.registration_path)
        self._servers.append(registration)

    async def stop(self) -> None:
        for server in reversed(self._servers):
            await server.stop(grace=1.0)
        self._servers.clear()
        for path in (self.registration_path, self.service_path):
            path.unlink(missing_ok=True)


async def _serve(server: grpc.aio.Server, path: Path) -> None:
    await serve_unix(server, path)
    os.chmod(path, 0o600)  # only kubelet (root) may call: not left to the umask
