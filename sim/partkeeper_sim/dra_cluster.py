"""The simulated cluster in DRA mode (`partkeeper sim cluster --mode dra`).

In place of the device-plugin kubelet it runs the simulated scheduler (claims allocated as the
structured allocator does, then the Pod bound) and the kubelet's DRA side (plugin registration
in `<kubelet>/plugins_registry`, prepare before a Pod starts, unprepare after it stops), and it
creates the DeviceClass `partitions.partkeeper.io` and one DeviceClass per profile with
`extendedResourceName` (KEP-5004) as an administrator applying deploy/components/dra/ would.

With `device_plugins` (the cluster's `both` mode) the device-plugin kubelet runs too, on the
same node, as the real kubelet runs both managers: Pods with ResourceClaims or a special claim go
to the DRA side, the others to the device plugins (kubelet/split.py), and the Node's status
carries the device plugins' resources, which decide whether the scheduler serves an extended
resource through DRA. A node moves between the modes by restarting its allocator alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from partkeeper.dra import DRIVER
from partkeeper.dra.classes import extended_classes
from partkeeper.lifecycle import cancel_all
from partkeeper_sim.kubelet.cluster import ClusterPodSource
from partkeeper_sim.kubelet.dra import DraKubelet
from partkeeper_sim.kubelet.kubelet import SimKubelet
from partkeeper_sim.kubelet.node import NoDevices, node_status
from partkeeper_sim.kubelet.split import SplitSource, uses_dra
from partkeeper_sim.scheduler.loop import DraScheduler

log = logging.getLogger(__name__)

DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}


def registry_dir(kubelet_root: Path) -> Path:
    return kubelet_root / "plugins_registry"


def _install_classes(api: client.ResourceV1Api) -> None:
    for body in (DEVICE_CLASS, *extended_classes()):
        try:
            api.create_device_class(body)
        except ApiException as exc:
            if exc.status != 409:
                raise


async def run(node: str, kubeconfig: Path, kubelet_root: Path, stop: asyncio.Event, *,
              termination_delay: float = 0.0, device_plugins: bool = False,
              ready: asyncio.Event | None = None) -> None:
    """Serve the scheduler and the DRA kubelet (and with `device_plugins` the device-plugin
    kubelet) until `stop` is set; `ready` is set once everything serves."""
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        await asyncio.to_thread(_install_classes, client.ResourceV1Api(api_client))
        core = client.CoreV1Api(api_client)
        source = ClusterPodSource(core, node)
        plugins: SimKubelet | None = None
        if device_plugins:
            plugins = SimKubelet(
                kubelet_root / "device-plugins",
                SplitSource(ClusterPodSource(core, node), lambda pod: not uses_dra(pod)),
                pod_resources_socket=kubelet_root / "pod-resources" / "kubelet.sock",
                termination_delay=termination_delay)
            source = SplitSource(source, uses_dra)  # type: ignore[assignment]
        kubelet = DraKubelet(registry_dir(kubelet_root), source, api_client, node=node,
                             termination_delay=termination_delay)
        scheduler = asyncio.create_task(DraScheduler(api_client, node).run(),
                                        name="sim scheduler")
        try:
            async with contextlib.AsyncExitStack() as running:
                if plugins is not None:
                    await running.enter_async_context(plugins)
                await running.enter_async_context(kubelet)
                await running.enter_async_context(
                    node_status(node, kubeconfig, plugins if plugins is not None else NoDevices()))
                if ready is not None:
                    ready.set()
                await stop.wait()
        finally:
            await cancel_all([scheduler])
    finally:
        api_client.close()
