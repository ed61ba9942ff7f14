"""The simulated kubelet on the Kubernetes API: ClusterPodSource against the simulated API server,
reached through the real `kubernetes` client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from partkeeper_sim.kubelet import SimKubelet
from partkeeper_sim.kubelet.cluster import ClusterPodSource
from tests_support import kubeclient as testing
from tests_support import until
from tests_support.kubelet import DEADLINE, RESOURCE, FakePlugin, healthy, short_tmpdir

NODE = "node-a"


@dataclass
class Cluster:
    api: client.CoreV1Api
    kubelet: SimKubelet
    plugin: FakePlugin

    async def create(self, name: str, node: str = NODE, count: int = 1) -> str:
        body = testing.pod_manifest(name, node=node)
        body["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE: str(count)}}
        pod = await asyncio.to_thread(self.api.create_namespaced_pod, "default", body)
        return pod.metadata.uid

    def phase(self, name: str) -> str | None:
        try:
            return self.api.read_namespaced_pod(name, "default").status.phase
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def wait(self, predicate: Any, what: str) -> None:
        await until(lambda: asyncio.to_thread(predicate), what, DEADLINE)


@asynccontextmanager
async def cluster(kubeconfig: Path) -> AsyncIterator[Cluster]:
    """The simulated kubelet of NODE on the simulated API server (the `apiserver` fixture)."""
    with short_tmpdir() as directory:
        api = testing.core_v1(kubeconfig)
        source = ClusterPodSource.from_kubeconfig(NODE, kubeconfig)
        kubelet = SimKubelet(directory / "dp", source)
        plugin = FakePlugin(directory / "dp", healthy("d0", "d1"))
        await kubelet.start()
        try:
            await plugin.serve()
            await plugin.register()
            await kubelet.wait_for(lambda: kubelet.free(RESOURCE) == ["d0", "d1"], DEADLINE)
            yield Cluster(api, kubelet, plugin)
        finally:
            await kubelet.stop()
            await plugin.stop()
            api.api_client.close()


async def test_pods_of_this_node_are_admitted_and_reported_running(kubeconfig: Path) -> None:
    async with cluster(kubeconfig) as c:
        await c.create("mine")
        await c.create("elsewhere", node="node-b")
        await c.wait(lambda: c.phase("mine") == "Running", "mine Running")
        assert c.plugin.allocated_ids() == [["d0"]]
        assert c.phase("elsewhere") == "Pending"


async def test_admission_failure_is_written_to_the_pod_status(kubeconfig: Path) -> None:
    async with cluster(kubeconfig) as c:
        await c.create("greedy", count=3)
        await c.wait(lambda: c.phase("greedy") == "Failed", "greedy Failed")
        pod = await asyncio.to_thread(c.api.read_namespaced_pod, "greedy", "default")
        assert pod.status.reason == f"OutOf{RESOURCE}"


async def test_graceful_delete_stops_frees_and_removes_the_pod(kubeconfig: Path) -> None:
    async with cluster(kubeconfig) as c:
        uid = await c.create("victim", count=2)
        await c.wait(lambda: c.phase("victim") == "Running", "victim Running")
        await asyncio.to_thread(c.api.delete_namespaced_pod, "victim", "default")
        await c.wait(lambda: c.phase("victim") is None, "victim deleted")

        def gone_and_freed() -> bool:
            record = c.kubelet.record(uid)
            assert record is not None
            return record.gone and record.finalized and c.kubelet.free(RESOURCE) == ["d0", "d1"]

        await c.kubelet.wait_for(gone_and_freed, DEADLINE)
        # A successor with the same name is a different Pod and gets the freed devices.
        await c.create("victim", count=2)
        await c.wait(lambda: c.phase("victim") == "Running", "successor Running")
        assert c.plugin.allocated_ids() == [["d0", "d1"], ["d0", "d1"]]
