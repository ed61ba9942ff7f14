"""The simulated cluster in DRA mode (`partkeeper sim cluster --mode dra`).

In place of the device-plugin kubelet it runs the simulated scheduler (claims allocated as the
structured allocator does, then the Pod bound) and the kubelet's DRA side (plugin registration
in `<kubelet>/plugins_registry`, prepare before a Pod starts, unprepare after it stops), and it
creates the DeviceClass `partitions.partkeeper.io` as an administrator applying
deploy/components/dra/deviceclass.yaml would.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from partkeeper.dra import DRIVER
from partkeeper.lifecycle import cancel_all
from partkeeper_sim.kubelet.cluster import ClusterPodSource
from partkeeper_sim.kubelet.dra import DraKubelet
from partkeeper_sim.kubelet.node import NoDevices, node_status
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


def _install_class(api: client.ResourceV1Api) -> None:
    try:
        api.create_device_class(DEVICE_CLASS)
    except ApiException as exc:
        if exc.status != 409:
            raise


async def run(node: str, kubeconfig: Path, kubelet_root: Path, stop: asyncio.Event, *,
              termination_delay: float = 0.0) -> None:
    """Serve the scheduler and the DRA kubelet until `stop` is set."""
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        await asyncio.to_thread(_install_class, client.ResourceV1Api(api_client))
        source = ClusterPodSource(client.CoreV1Api(api_client), node)
        kubelet = DraKubelet(registry_dir(kubelet_root), source, api_client, node=node,
                             termination_delay=termination_delay)
        scheduler = asyncio.create_task(DraScheduler(api_client, node).run(),
                                        name="sim scheduler")
        try:
            async with kubelet, node_status(node, kubeconfig, NoDevices()):
                await stop.wait()
        finally:
            await cancel_all([scheduler])
    finally:
        api_client.close()
