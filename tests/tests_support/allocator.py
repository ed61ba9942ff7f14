"""A whole node for the allocator's tests: sim cards, the simulated kubelet (a real gRPC peer on
unix sockets), the table watcher and reclaimer, and the allocator itself via `serve`.

Every wait is for a condition with a deadline; nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import tempfile
import traceback
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nats.aio.client import Client

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.config import RESOURCE_NAMES, Config
from partkeeper.drivers import Driver, Instance
from partkeeper.kubelet import HEALTHY, deviceplugin_pb2, deviceplugin_pb2_grpc, open_unix_channel
from partkeeper_sim.driver import SimDriver, init_state
from partkeeper_sim.kubelet import MemoryPodSource, SimKubelet, pod_manifest
from schemas import Claim
from schemas.names import BUCKET_CLAIMS, BUCKET_PODS
from services.allocator.core.options import LookupPolicy, Options
from services.allocator.deviceplugin.registration import endpoint_name
from services.allocator.main import serve
from services.reclaimer.main import serve as serve_reclaimer
from services.reclaimer.tuning import Tuning
from tests_support import until
from tests_support.allocator_peers import TableReclaimer, TableWatcher
from tests_support.gate import Gate

pb = deviceplugin_pb2
DEADLINE = 15.0  # a bound on waiting, never an expectation of how long anything takes
MIG = "nvidia.com/mig-"
SLICED = "nvidia.com/gpu.sliced"

FAST = Options(
    room_wait_seconds=5.0,
    choose_wait_seconds=2.0,
    kubelet_poll_seconds=0.05,
    hardware_poll_seconds=0.05,
    reclaim_timeout=5.0,
    lookup=LookupPolicy(attempts=6, base=0.02, cap=0.2, timeout=2.0),
)

RECLAIMER = Tuning(fast_base=0.02, fast_cap=0.1, slow_base=0.1, slow_cap=0.3, now_wait=4.0,
                   watcher_timeout=1.0)


def new_uid() -> str:
    return str(uuid.uuid4())


@dataclass
class Node:
    directory: Path
    config: Config
    driver: Driver  # the SimDriver (with its controls) unless the test passed another
    store: ClaimsStore
    source: MemoryPodSource
    kubelet: SimKubelet
    watcher: TableWatcher
    reclaimer: TableReclaimer
    task: asyncio.Task[None]
    real_reclaimer: asyncio.Task[None] | None = None

    @property
    def sim(self) -> SimDriver:
        """The simulated driver and its controls (`fail`, `carve`), failing the test when the
        node runs a vendor driver."""
        if not isinstance(self.driver, SimDriver):
            raise AssertionError(f"the node runs the {self.driver.name} driver, not the sim")
        return self.driver

    # -- Pods ------------------------------------------------------------------------------

    async def add_pod(self, name: str, containers: Mapping[str, Mapping[str, int]],
                      *, uid: str | None = None,
                      init: Mapping[str, Mapping[str, int]] | None = None) -> str:
        """The watcher learns of the Pod, then kubelet gets it and admits it (Allocate)."""
        uid = uid or new_uid()
        every = {**(init or {}), **containers}  # init containers first, as the watcher lists
        await self.watcher.add(self.watcher.record(uid, name, {c: dict(r) for c, r in
                                                               every.items()}))
        self.source.add(pod_manifest(name, uid, containers, node=self.config.node, init=init))
        return uid

    async def phase(self, uid: str, phase: str) -> None:
        def reported() -> bool:
            report = self.source.last_report(uid)
            return report is not None and report.phase == phase

        await until(reported, f"Pod {uid} reported {phase}; reports: {self.source.reports}")

    def report(self, uid: str) -> str:
        last = self.source.last_report(uid)
        return f"{last.phase} {last.reason}: {last.message}" if last else "none"

    # -- claims, hardware, tokens ----------------------------------------------------------

    async def claims(self) -> list[Claim]:
        docs = await self.store.read_all(self.reclaimer.cards)
        return [c for card in sorted(docs) for c in docs[card][0].claims.values()]

    async def claims_of(self, uid: str) -> list[Claim]:
        return [c for c in await self.claims() if c.pod_uid == uid]

    async def instances(self, card: int = 0) -> list[Instance]:
        return await asyncio.to_thread(self.driver.instances, card)

    def devices(self, resource: str) -> dict[str, str]:
        return self.kubelet.devices(resource)

    def healthy(self, resource: str) -> int:
        return sum(1 for h in self.devices(resource).values() if h == HEALTHY)

    async def wait_healthy(self, resource: str, count: int) -> None:
        await until(lambda: self.healthy(resource) == count,
                    f"{count} Healthy {resource} tokens (kubelet has {self.devices(resource)})")

    # -- direct calls, as kubelet makes them -------------------------------------------------

    async def allocate(self, resource: str, ids: list[str],
                       timeout: float = 30.0) -> pb.ContainerAllocateResponse:
        request = pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=ids)])
        async with open_unix_channel(self.config.kubelet_dir / endpoint_name(resource)) as ch:
            stub = deviceplugin_pb2_grpc.DevicePluginStub(ch)
            reply = await stub.Allocate(request, timeout=timeout)
        return reply.container_responses[0]


@contextlib.asynccontextmanager
async def node_stack(
    nc: Client,
    node: str,
    *,
    cards: tuple[str, ...] = ("H100-80GB",),
    sliced: tuple[str, ...] = (),
    options: Options = FAST,
    slices_per_card: int = 4,
    pod_resources: bool = True,
    gate: Gate | None = None,
    real_reclaimer: bool = False,
    driver: Driver | None = None,
    # Config fields by name: a bag of keywords mypy cannot type per field; `replace` refuses an
    # unknown name when the test runs.
    settings: Mapping[str, Any] | None = None,
) -> AsyncIterator[Node]:
    """A node; `pod_resources=False` points the allocator at a socket that does not exist, for
    tests that call Allocate themselves (kubelet would list the Pod it admits; these have none).
    With a `gate`, the simulated driver spends its latencies in it: an operation given a latency
    parks until the test opens the gate. `real_reclaimer=True` runs the reclaimer service itself
    (its `reclaim.now` and reconcile pass) instead of the table stand-in. `driver`: an opened
    vendor driver (over its fake library) instead of the sim with `cards` and `sliced`; the
    resources are named as for that driver. `settings`: more `Config` fields."""
    directory = Path(tempfile.mkdtemp(prefix="pk", dir="/tmp"))
    state = directory / "sim.json"
    if driver is None:
        init_state(state, list(cards), list(sliced))
        driver = SimDriver(state) if gate is None else SimDriver(state, sleep=gate.sleep)
    prefix, sliced_resource = RESOURCE_NAMES[driver.name]  # as `config.load` derives them
    podres = directory / ("pr.sock" if pod_resources else "absent.sock")
    config = Config(node=node, kubelet_dir=directory / "dp",
                    pod_resources_socket=podres, pods_dir=directory / "pods",
                    driver=_config_driver(driver), sim_state=state,
                    slices_per_card=slices_per_card, resource_prefix=prefix,
                    sliced_resource=sliced_resource)
    config = dataclasses.replace(config, **(settings or {}))
    js = nc.jetstream()
    store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), node)
    source = MemoryPodSource()
    kubelet = SimKubelet(config.kubelet_dir, source,
                         pod_resources_socket=directory / "pr.sock")
    watcher = await TableWatcher(nc, await js.key_value(BUCKET_PODS), node).start()
    indexes = [c.index for c in await asyncio.to_thread(driver.cards)]
    reclaimer = TableReclaimer(nc, store, driver, node, indexes)
    real = None
    if real_reclaimer:
        up = asyncio.Event()
        real = asyncio.create_task(serve_reclaimer(config, nc, ready=up, tuning=RECLAIMER),
                                   name="reclaimer under test")
        await until(lambda: up.is_set() or real.done(), "the reclaimer is ready")
    else:
        await reclaimer.start()
    await kubelet.start()
    ready = asyncio.Event()
    task = asyncio.create_task(
        serve(config, nc, ready=ready, options=_with_driver(options, driver)),
        name="allocator under test",
    )
    stack = Node(directory, config, driver, store, source, kubelet, watcher, reclaimer, task,
                 real)
    try:
        await until(lambda: ready.is_set() or task.done(), "the allocator is ready")
        if task.done():
            task.result()
        await until(lambda: bool(kubelet.registrations) and all(
            kubelet.devices(r.resource_name) for r in kubelet.registrations),
            "kubelet received every resource's device list")
        yield stack
        if task.done():
            task.result()  # the allocator must not have stopped on its own: show why it did
    finally:
        if gate is not None:
            gate.open()  # a test that failed with the gate shut must not hold the teardown
        if task.done() and not task.cancelled() and task.exception() is not None:
            traceback.print_exception(task.exception())  # why the allocator stopped early
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kubelet.stop()
        await watcher.stop()
        await reclaimer.stop()
        if real is not None:
            real.cancel()
            await asyncio.gather(real, return_exceptions=True)
        shutil.rmtree(directory, ignore_errors=True)


def _with_driver(options: Options, driver: Driver) -> Options:
    return dataclasses.replace(options, driver=driver)


def _config_driver(driver: Driver) -> Literal["nvml", "hgml", "dmi", "sim"]:
    """`driver.name` as `Config.driver` spells it (the `Driver` protocol says only `str`)."""
    match driver.name:
        case "nvml" | "hgml" | "dmi" | "sim" as name:
            return name
    raise AssertionError(f"no PK_DRIVER value names the {driver.name!r} driver")
