"""The simulated kubelet's Node: registered with the API server and its status kept current.

As kubelet does (pkg/kubelet/kubelet_node_status.go): at start it creates its Node
(`registerWithAPIServer`), taking over an existing one of the same name (a restart, or this
server's auto-created Node) by patching it, and then writes `status` periodically
(`nodeStatusUpdateFrequency`, 10 s upstream; `period` here) and when what it reports changes.
The device manager's resources go into `status.capacity` (every device a plugin lists, healthy
or not) and `status.allocatable` (the healthy ones), as `devicemanager.GetCapacity` splits them;
a resource whose plugin went away is set to 0 rather than dropped ("Set capacity for removed
resource to 0 on device removal"), so the scheduler stops counting on it. The condition `Ready`
carries kubelet's reason and message, `lastHeartbeatTime` moves on every write.

The writes are JSON merge patches of `nodes/<name>/status` through the `kubernetes` client, the
same API the real kubelet uses (it sends a strategic merge patch; for these maps the two agree).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import platform
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from partkeeper import backoff
from partkeeper.lifecycle import cancel_all
from partkeeper_sim.apiserver.discovery import VERSION
from partkeeper_sim.kubelet.cluster import MERGE_PATCH, REQUEST_TIMEOUT

log = logging.getLogger(__name__)

# The release the simulated API server claims (apiserver/discovery.py): one version for the node
# and the control plane, the one DRA mode needs (resource.k8s.io/v1, 1.35).
KUBELET_VERSION = VERSION["gitVersion"]
HEALTHY = "Healthy"
# What a small node offers besides the device plugins' resources.
MACHINE = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}


class Devices(Protocol):
    """What the node status reads of the kubelet (SimKubelet has these)."""

    @property
    def registrations(self) -> list[Any]: ...
    def devices(self, resource: str) -> dict[str, str]: ...
    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None: ...


def resources(kubelet: Devices, before: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of the device-plugin resources; `before`: the capacity last
    written, whose resources no plugin serves any more are reported as 0. Pure but for reads."""
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}
    for name in sorted({r.resource_name for r in kubelet.registrations}):
        listed = kubelet.devices(name)
        capacity[name] = str(len(listed))
        allocatable[name] = str(sum(1 for h in listed.values() if h == HEALTHY))
    for name in before:
        if "/" in name and name not in capacity:  # an extended resource gone with its plugin
            capacity[name] = allocatable[name] = "0"
    return capacity, allocatable


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_object(name: str) -> dict[str, Any]:
    """The Node as kubelet first registers it (labels from `nodeLabels` + well-known ones)."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
        }},
        "spec": {},
    }


def status_patch(
    name: str, capacity: Mapping[str, str], allocatable: Mapping[str, str], since: str
) -> dict[str, Any]:
    now = _now()
    return {"status": {
        "capacity": {**MACHINE, **capacity},
        "allocatable": {**MACHINE, **allocatable},
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
            "lastTransitionTime": since,
        }],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                      {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux", "architecture": "amd64",
            "osImage": "partkeeper simulated node", "kernelVersion": platform.release(),
            "containerRuntimeVersion": "sim://0.1.0", "machineID": "", "systemUUID": "",
            "bootID": "",
        },
    }}


class NodeStatus:
    """Registers `name` and keeps its status current until cancelled."""

    def __init__(self, api: client.CoreV1Api, name: str, kubelet: Devices, *,
                 period: float = 10.0, retry_delay: float = 1.0) -> None:
        self.api, self.name, self.kubelet = api, name, kubelet
        self.period, self.retry_delay = period, retry_delay
        self.written: dict[str, str] = {}  # the capacity last written
        self.writes = 0

    async def run(self) -> None:
        await self._retrying(self.register)
        since = _now()
        while True:
            shown = resources(self.kubelet, self.written)
            await self._retrying(functools.partial(self.write, *shown, since))
            with contextlib.suppress(TimeoutError):  # no change: the heartbeat
                await self.kubelet.wait_for(functools.partial(self._changed, shown), self.period)

    def _changed(self, shown: tuple[dict[str, str], dict[str, str]]) -> bool:
        return resources(self.kubelet, self.written) != shown

    async def register(self) -> None:
        try:
            await asyncio.to_thread(self.api.create_node, node_object(self.name),
                                    _request_timeout=REQUEST_TIMEOUT)
            log.info("registered Node %s", self.name)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # Already there: take it over, as kubelet's tryRegisterWithAPIServer does.
            labels = {"metadata": {"labels": node_object(self.name)["metadata"]["labels"]}}
            await asyncio.to_thread(self.api.patch_node, self.name, labels,
                                    _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT)
            log.info("took over the existing Node %s", self.name)

    async def write(self, capacity: dict[str, str], allocatable: dict[str, str],
                    since: str) -> None:
        body = status_patch(self.name, capacity, allocatable, since)
        await asyncio.to_thread(self.api.patch_node_status, self.name, body,
                                _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT)
        self.written = dict(capacity)
        self.writes += 1

    async def _retrying(self, call: Callable[[], Any]) -> None:
        """Until it works or we are cancelled: the API server may be restarting."""
        attempt = 0
        while True:
            try:
                await call()
                return
            except (ApiException, HTTPError, OSError) as exc:
                attempt += 1
                wait = backoff.delay(attempt, base=self.retry_delay / 4, cap=self.retry_delay * 5)
                log.warning("Node %s: %r; again in %.1fs", self.name, exc, wait)
                await asyncio.sleep(wait)


class NoDevices:
    """A kubelet without device plugins (DRA mode): the Node has no extended resources."""

    registrations: list[Any] = []

    def devices(self, resource: str) -> dict[str, str]:
        return {}

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        await asyncio.sleep(timeout)
        raise TimeoutError


@contextlib.asynccontextmanager
async def node_status(name: str, kubeconfig: Path | str, kubelet: Devices,
                      period: float = 10.0) -> AsyncIterator[NodeStatus]:
    """Run the Node's registration and status writes for as long as the block runs."""
    api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    status = NodeStatus(api, name, kubelet, period=period)
    task = asyncio.create_task(status.run(), name=f"sim-kubelet node {name}")
    try:
        yield status
    finally:
        await cancel_all([task])
        api.api_client.close()
