"""One node in DRA mode for tests: sim cards, the simulated API server (real client), a table
watcher and reclaimer over real NATS, the allocator's DRA `serve`, and kubelet's side as real
gRPC calls on the plugin's unix sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kubernetes import client, config
from nats.aio.client import Client

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.dra import DRIVER
from partkeeper.drivers import Instance
from partkeeper.kubelet import dra_pb2, dra_pb2_grpc, open_unix_channel
from partkeeper_sim.driver import SimDriver, init_state
from partkeeper_sim.kubelet.cluster import ClusterPodSource
from partkeeper_sim.kubelet.dra import DraKubelet
from partkeeper_sim.scheduler.loop import DraScheduler
from schemas import Claim
from schemas.names import BUCKET_CLAIMS, BUCKET_PODS
from services.allocator.core.options import Options
from services.allocator.main import serve
from tests_support import until
from tests_support.allocator import FAST
from tests_support.allocator_peers import TableReclaimer, TableWatcher

pb = dra_pb2
NAMESPACE = "default"


def claim_body(name: str, profile: str) -> dict[str, Any]:
    selector = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [{
        "name": "mig", "exactly": {"deviceClassName": DRIVER,
                                   "selectors": [{"cel": {"expression": selector}}]}}]}}}


@dataclass
class DraNode:
    directory: Path
    config: Config
    driver: SimDriver
    store: ClaimsStore
    watcher: TableWatcher
    reclaimer: TableReclaimer
    api: client.ResourceV1Api
    task: asyncio.Task[None]

    @property
    def node(self) -> str:
        return self.config.node

    # -- the API server's side (what the scheduler would have written) ------------------------

    async def allocated(self, name: str, device: str, pod_uid: str, pod_name: str,
                        profile: str = "1g.10gb") -> pb.Claim:
        """A ResourceClaim allocated to `device` and reserved for the Pod; the watcher knows
        the Pod as live."""
        await self.watcher.add(self.watcher.record(pod_uid, pod_name, {}))

        def make() -> Any:
            made = self.api.create_namespaced_resource_claim(NAMESPACE, claim_body(name, profile))
            status = {"status": {
                "allocation": {"devices": {"results": [{"request": "mig", "driver": DRIVER,
                                                        "pool": self.node, "device": device}]}},
                "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}]}}
            self.api.patch_namespaced_resource_claim_status(name, NAMESPACE, status)
            return made

        made = await asyncio.to_thread(make)
        return pb.Claim(namespace=NAMESPACE, uid=made.metadata.uid, name=name)

    async def slices(self) -> list[Any]:
        listed = await asyncio.to_thread(self.api.list_resource_slice,
                                         field_selector=f"spec.nodeName={self.node}")
        return listed.items

    async def offered(self) -> list[str]:
        """Device names of the newest complete generation, in slice order."""
        items = await self.slices()
        if not items:
            return []
        top = max(s.spec.pool.generation for s in items)
        current = sorted((s for s in items if s.spec.pool.generation == top),
                         key=lambda s: s.metadata.name)
        if len(current) != current[0].spec.pool.resource_slice_count:
            return []
        return [d.name for s in current for d in (s.spec.devices or [])]

    # -- kubelet's side ------------------------------------------------------------------------

    async def prepare(self, *claims: pb.Claim, timeout: float = 30.0
                      ) -> dict[str, pb.NodePrepareResourceResponse]:
        async with open_unix_channel(self.service_socket) as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)
            reply = await stub.NodePrepareResources(
                pb.NodePrepareResourcesRequest(claims=list(claims)), timeout=timeout)
        return dict(reply.claims)

    async def unprepare(self, *claims: pb.Claim) -> dict[str, pb.NodeUnprepareResourceResponse]:
        async with open_unix_channel(self.service_socket) as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)
            reply = await stub.NodeUnprepareResources(
                pb.NodeUnprepareResourcesRequest(claims=list(claims)), timeout=30.0)
        return dict(reply.claims)

    @property
    def service_socket(self) -> Path:
        return self.config.kubelet_plugins_dir / DRIVER / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.config.kubelet_registry_dir / f"{DRIVER}-reg.sock"

    # -- store and hardware --------------------------------------------------------------------

    async def claims(self) -> list[Claim]:
        docs = await self.store.read_all([0])
        return [c for card in sorted(docs) for c in docs[card][0].claims.values()]

    async def instances(self, card: int = 0) -> list[Instance]:
        return await asyncio.to_thread(self.driver.instances, card)


def dra_config(directory: Path, node: str, kubeconfig: Path, state: Path) -> Config:
    return Config(node=node, kubeconfig=str(kubeconfig), kubelet_dir=directory / "dp",
                  pod_resources_socket=directory / "absent.sock", pods_dir=directory / "pods",
                  driver="sim", sim_state=state, mode="dra", cdi_dir=directory / "cdi",
                  kubelet_plugins_dir=directory / "plugins",
                  kubelet_registry_dir=directory / "plugins_registry")


@contextlib.asynccontextmanager
async def dra_node(nc: Client, node: str, kubeconfig: Path, *,
                   cards: tuple[str, ...] = ("H100-80GB",),
                   options: Options = FAST, wait_ready: bool = True) -> AsyncIterator[DraNode]:
    directory = Path(tempfile.mkdtemp(prefix="pkd", dir="/tmp"))
    state = directory / "sim.json"
    init_state(state, list(cards), [])
    driver = SimDriver(state)
    config = dra_config(directory, node, kubeconfig, state)
    js = nc.jetstream()
    store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), node)
    watcher = await TableWatcher(nc, await js.key_value(BUCKET_PODS), node).start()
    reclaimer = await TableReclaimer(nc, store, driver, node, list(range(len(cards)))).start()
    from kubernetes import config as kube_config

    api = client.ResourceV1Api(kube_config.new_client_from_config(config_file=str(kubeconfig)))
    ready = asyncio.Event()
    task = asyncio.create_task(serve(config, nc, ready=ready,
                                     options=replace(options, driver=driver)),
                               name="allocator under test")
    stack = DraNode(directory, config, driver, store, watcher, reclaimer, api, task)
    try:
        if wait_ready:
            await until(lambda: ready.is_set() or task.done(), "the DRA allocator is ready")
        if task.done():
            task.result()
        yield stack
        if task.done():
            task.result()
    finally:
        if task.done() and not task.cancelled() and task.exception() is not None:
            traceback.print_exception(task.exception())
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await watcher.stop()
        await reclaimer.stop()
        api.api_client.close()
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.asynccontextmanager
async def control_plane(stack: DraNode, kubeconfig: Path, *, wipe_delay: float = 30.0
                        ) -> AsyncIterator[tuple[client.CoreV1Api, client.ResourceV1Api,
                                                 DraScheduler, DraKubelet]]:
    """The simulated scheduler and the simulated kubelet's DRA side over `stack`'s node, with
    our DeviceClass and a claim template per profile, through the real client."""
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    core = client.CoreV1Api(api_client)
    resource = client.ResourceV1Api(api_client)
    resource.create_device_class({"metadata": {"name": DRIVER}, "spec": {"selectors": [
        {"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
    for profile in ("7g.80gb", "1g.10gb"):
        resource.create_namespaced_resource_claim_template(NAMESPACE, {
            "metadata": {"name": f"mig-{profile.replace('.', '-')}"},
            "spec": claim_body("x", profile)})
    scheduler = DraScheduler(api_client, stack.node, interval=0.02)
    source = ClusterPodSource(core, stack.node)
    kubelet = DraKubelet(stack.config.kubelet_registry_dir, source, api_client, node=stack.node,
                         poll=0.02, retry=0.05, wipe_delay=wipe_delay)
    task = asyncio.create_task(scheduler.run(), name="sim scheduler")
    try:
        async with kubelet:
            yield core, resource, scheduler, kubelet
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        api_client.close()


def phase(core: client.CoreV1Api, name: str) -> str:
    return core.read_namespaced_pod(name, NAMESPACE).status.phase
