"""The simulated kubelet's DRA plugin registry: registration, and the wiping of ResourceSlices.

As kubelet's plugin watcher and DRA plugin manager do (k8s.io/kubernetes pkg/kubelet/pluginmanager,
pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go):

- a socket appearing in the `plugins_registry` dir is asked `GetInfo`; a `DRAPlugin` offering
  `v1.DRAPlugin` is told it is registered and its service socket remembered by driver name;
- at start, before any plugin registers, every ResourceSlice of the node is deleted, whatever
  its driver (`wipeResourceSlices` with no delay and no driver): slices a driver published before
  the kubelet restarted are not trusted until the driver is back;
- a plugin that becomes unusable (its registration socket is gone, or nothing listens on its
  service socket any more) has its driver's slices of the node deleted once it has stayed
  unusable for `wipe_delay` (kubelet: 30 s, `defaultWipingDelay`); registering again in time
  cancels that.

Both wipes are a DELETE of each matching slice (kubelet sends one DeleteCollection with the
field selector `spec.nodeName=<node>[,spec.driver=<driver>]`; the simulated API server has no
collection delete, and nothing observes the difference).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path

import grpc
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from partkeeper.kubelet import dra_registration_pb2, dra_registration_pb2_grpc, open_unix_channel
from partkeeper.lifecycle import cancel_all

log = logging.getLogger(__name__)

DRA_PLUGIN = "DRAPlugin"
DRA_VERSION = "v1.DRAPlugin"
WIPE_DELAY = 30.0


class DraPlugins:
    def __init__(self, registry_dir: Path, node: str, api_client: client.ApiClient, *,
                 poll: float = 0.05, wipe_delay: float = WIPE_DELAY) -> None:
        self.registry_dir = Path(registry_dir)
        self.node = node
        self.resource = client.ResourceV1Api(api_client)
        self.poll = poll
        self.wipe_delay = wipe_delay
        self.plugins: dict[str, str] = {}  # driver -> service socket
        # driver -> how many times it registered: kubelet makes a new DRAPlugin, and with it a
        # new connection, on every registration (dra_plugin_manager.go, RegisterPlugin).
        self.registrations: dict[str, int] = {}
        # driver -> the services its registration listed (the health stream's version).
        self.services: dict[str, list[str]] = {}
        self.wiped = 0  # slices deleted by wipes (tests, bench)
        self._sockets: dict[str, str] = {}  # registration socket -> driver
        self._refused: set[str] = set()  # registration sockets told no (asked again if renewed)
        self._wipes: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        await self.wipe("")
        try:
            while True:
                await self._scan()
                await asyncio.sleep(self.poll)
        finally:
            await cancel_all(self._wipes.values())

    async def wipe(self, driver: str) -> None:
        """Delete this node's slices (of `driver`, or of every driver for "")."""
        selector = f"spec.nodeName={self.node}" + (f",spec.driver={driver}" if driver else "")
        try:
            listed = await asyncio.to_thread(self.resource.list_resource_slice,
                                             field_selector=selector)
            for item in listed.items:
                with contextlib.suppress(ApiException):
                    await asyncio.to_thread(self.resource.delete_resource_slice,
                                            item.metadata.name)
                    self.wiped += 1
        except (ApiException, OSError) as exc:
            log.warning("wiping the ResourceSlices (%s) failed: %s", selector, exc)
            return
        log.info("wiped the ResourceSlices of node %s%s", self.node,
                 f" for driver {driver}" if driver else "")

    async def _scan(self) -> None:
        sockets = {str(p) for p in await asyncio.to_thread(_sockets, self.registry_dir)}
        self._refused &= sockets
        for path in sorted(sockets - set(self._sockets) - self._refused):
            driver = await self._register(Path(path))
            if driver:
                self._sockets[path] = driver
                self._cancel_wipe(driver)
        for path in sorted(set(self._sockets) - sockets):
            self._unusable(self._sockets.pop(path))
        for driver, endpoint in list(self.plugins.items()):
            if not await asyncio.to_thread(_answers, endpoint):
                self._unusable(driver)

    def _unusable(self, driver: str) -> None:
        self.plugins.pop(driver, None)
        self._sockets = {p: d for p, d in self._sockets.items() if d != driver}
        if driver not in self._wipes:
            log.info("DRA plugin %s is unusable; its slices go in %gs unless it is back",
                     driver, self.wipe_delay)
            self._wipes[driver] = asyncio.create_task(self._wipe_later(driver),
                                                      name=f"sim-kubelet wipe {driver}")

    def _cancel_wipe(self, driver: str) -> None:
        task = self._wipes.pop(driver, None)
        if task is not None:
            task.cancel()

    async def _wipe_later(self, driver: str) -> None:
        try:
            await asyncio.sleep(self.wipe_delay)
            await self.wipe(driver)
        finally:
            if self._wipes.get(driver) is asyncio.current_task():
                del self._wipes[driver]

    async def _register(self, path: Path) -> str:
        """The driver registered from `path`, or "" (not answering yet, or refused)."""
        try:
            async with open_unix_channel(path) as channel:
                stub = dra_registration_pb2_grpc.RegistrationStub(channel)
                info = await stub.GetInfo(dra_registration_pb2.InfoRequest(), timeout=5)
                ok = info.type == DRA_PLUGIN and DRA_VERSION in info.supported_versions
                error = "" if ok else f"type {info.type} versions {list(info.supported_versions)}"
                await stub.NotifyRegistrationStatus(dra_registration_pb2.RegistrationStatus(
                    plugin_registered=ok, error=error), timeout=5)
        except grpc.aio.AioRpcError as exc:
            log.info("plugin socket %s not answering yet (%s)", path, exc.code())
            return ""
        if not ok:
            self._refused.add(str(path))
            return ""
        self.plugins[info.name] = info.endpoint
        self.services[info.name] = list(info.supported_versions)
        self.registrations[info.name] = self.registrations.get(info.name, 0) + 1
        log.info("registered DRA plugin %s at %s", info.name, info.endpoint)
        return str(info.name)


def _answers(endpoint: str) -> bool:
    """Whether something listens on the service socket: a plugin that crashed leaves the file
    behind, and only a connect tells (kubelet watches its gRPC connection's state)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(endpoint)
        except OSError:
            return False
    return True


def _sockets(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith("-reg.sock"))
    except FileNotFoundError:
        return []
