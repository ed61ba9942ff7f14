"""One whole simulated node in this process for the chaos run (bench/chaos.py): the simulated
API server, the simulated kubelet reading it through the real `kubernetes` client, and the real
watcher, allocator and reclaimer over one nats-server, with the sim driver. The allocator and
the reclaimer can be stopped and started again at any step (their tasks are cancelled, as a
SIGTERM would end them); the kubelet can restart (its plugins must register again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nats
from kubernetes import client, config
from nats.aio.client import Client

from partkeeper.bus.kv import Bucket
from partkeeper.bus.permissions import ADMIN, inbox_prefix
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers import Instance
from partkeeper_sim.apiserver import ApiServer, write_kubeconfig
from partkeeper_sim.driver import SimDriver, init_state
from partkeeper_sim.kubelet.cluster import ClusterPodSource
from partkeeper_sim.kubelet.kubelet import SimKubelet
from schemas import Claim
from schemas.names import BUCKET_CLAIMS, encode_token
from services.allocator.core.options import LookupPolicy, Options
from services.allocator.main import serve as serve_allocator
from services.reclaimer.main import serve as serve_reclaimer
from services.reclaimer.tuning import Tuning as ReclaimerTuning
from services.watcher.main import serve as serve_watcher
from services.watcher.tuning import Tuning as WatcherTuning

NAMESPACE = "chaos"
READY_SECONDS = 30.0
CPU_MILLIS = 4000  # the node's allocatable CPU: a Pod asking for more is rejected OutOfcpu

ALLOCATOR = Options(
    room_wait_seconds=2.0, choose_wait_seconds=1.0, kubelet_poll_seconds=0.05,
    hardware_poll_seconds=0.2, reclaim_timeout=5.0,
    lookup=LookupPolicy(attempts=5, base=0.02, cap=0.2, timeout=2.0),
)
RECLAIMER = ReclaimerTuning(fast_base=0.02, fast_cap=0.2, slow_base=0.2, slow_cap=1.0,
                            event_patience=2.0, event_redelivery_cap=0.5, now_wait=3.0,
                            watcher_timeout=1.0, create_timeout=5.0)
WATCHER = WatcherTuning(watch_timeout_seconds=5, request_timeout=(2.0, 10.0), retry_base=0.05,
                        retry_cap=0.5, event_attempts=1)

Serve = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


class NodeError(Exception):
    """The node could not be brought up or a service did not come back."""


@dataclass
class Service:
    name: str
    serve: Serve
    task: asyncio.Task[None] | None = None
    starts: int = 0

    async def start(self) -> None:
        ready = asyncio.Event()
        self.task = asyncio.create_task(self.serve(ready), name=f"chaos {self.name}")
        self.starts += 1
        async with asyncio.timeout(READY_SECONDS):
            while not ready.is_set():
                if self.task.done():
                    self.task.result()
                    raise NodeError(f"the {self.name} ended before it was ready")
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def check(self) -> None:
        """Raise what ended the service on its own, if it did."""
        if self.task is not None and self.task.done():
            self.task.result()
            raise NodeError(f"the {self.name} stopped on its own")


@dataclass
class ChaosNode:
    directory: Path
    config: Config
    driver: SimDriver
    store: ClaimsStore
    kubelet: SimKubelet
    api: client.CoreV1Api
    services: dict[str, Service] = field(default_factory=dict)

    # -- Pods through the API server, as a user and a scheduler would --------------------------

    async def create(self, name: str, resource: str, *, cpu: str = "100m") -> str:
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox",
                "resources": {"limits": {resource: "1"},
                              "requests": {resource: "1", "cpu": cpu}},
            }]},
        }
        resp = await asyncio.to_thread(self.api.create_namespaced_pod, NAMESPACE, body,
                                       _preload_content=False)
        return str(json.loads(resp.data)["metadata"]["uid"])

    async def bind(self, name: str) -> None:
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name),
            target=client.V1ObjectReference(api_version="v1", kind="Node",
                                            name=self.config.node),
        )
        await asyncio.to_thread(self.api.create_namespaced_pod_binding, name, NAMESPACE,
                                binding, _preload_content=False)

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self.api.delete_namespaced_pod, name, NAMESPACE,
                                _preload_content=False)

    # -- what exists -----------------------------------------------------------------------

    async def claims(self) -> list[Claim]:
        docs = await self.store.read_all([0])
        return [c for card in sorted(docs) for c in docs[card][0].claims.values()]

    async def instances(self) -> list[Instance]:
        return await asyncio.to_thread(self.driver.instances, 0)

    def check_services(self) -> None:
        for service in self.services.values():
            service.check()
        if self.kubelet.sync_error is not None:
            raise NodeError("the simulated kubelet stopped handling Pod events") \
                from self.kubelet.sync_error


@contextlib.asynccontextmanager
async def chaos_node(
    nc: Client, node: str, *, card: str = "H100-80GB", allocator: Options = ALLOCATOR
) -> AsyncIterator[ChaosNode]:
    directory = Path(tempfile.mkdtemp(prefix="pkc", dir="/tmp"))
    # The node's services share a connection of their own, with the node's operators' inbox:
    # the services answer only their node's inboxes (bus/rpc.py), and `nc` may serve many nodes.
    url = nc.connected_url
    own = await nats.connect(servers=[f"nats://{url.netloc}" if url else "nats://127.0.0.1"],
                             inbox_prefix=inbox_prefix(ADMIN, encode_token(node)))
    nc = own
    server = ApiServer(bookmark_interval=0.2)
    await server.start()
    kubeconfig = directory / "kubeconfig"
    started: list[Service] = []
    kubelet: SimKubelet | None = None
    api: client.CoreV1Api | None = None
    try:
        write_kubeconfig(kubeconfig, server.url)
        init_state(directory / "sim.json", [card], [])
        cfg = Config(node=node, kubeconfig=str(kubeconfig), kubelet_dir=directory / "dp",
                     pod_resources_socket=directory / "pr.sock", pods_dir=directory / "pods",
                     driver="sim", sim_state=directory / "sim.json", resync_seconds=1.0)
        driver = SimDriver(cfg.sim_state)
        source = ClusterPodSource.from_kubeconfig(node, kubeconfig)
        kubelet = SimKubelet(cfg.kubelet_dir, source, pod_resources_socket=cfg.pod_resources_socket,
                             cpu_millis=CPU_MILLIS)
        await kubelet.start()
        api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
        store = ClaimsStore(await Bucket.open(nc.jetstream(), BUCKET_CLAIMS), node)
        chaos = ChaosNode(directory, cfg, driver, store, kubelet, api)
        options = replace(allocator, driver=driver)
        chaos.services = {
            "watcher": Service("watcher", lambda r: serve_watcher(cfg, nc, ready=r,
                                                                  tuning=WATCHER)),
            "reclaimer": Service("reclaimer", lambda r: serve_reclaimer(cfg, nc, ready=r,
                                                                        tuning=RECLAIMER)),
            "allocator": Service("allocator", lambda r: serve_allocator(cfg, nc, ready=r,
                                                                        options=options)),
        }
        for service in chaos.services.values():
            await service.start()
            started.append(service)
        yield chaos
    finally:
        for service in reversed(started):
            await service.stop()
        if kubelet is not None:
            await kubelet.stop()
        if api is not None:
            api.api_client.close()
        await server.stop()
        await own.close()
        shutil.rmtree(directory, ignore_errors=True)
