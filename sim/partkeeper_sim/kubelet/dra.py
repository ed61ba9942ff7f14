"""The simulated kubelet's DRA side: Node(Un)PrepareResources around the Pods of its node.

As kubelet's DRA manager does (k8s.io/kubernetes pkg/kubelet/cm/dra/manager.go):

- plugins register through `DraPlugins` (draplugins.py), which also wipes the node's
  ResourceSlices at start and after a plugin has been unusable for a while;
- before a Pod bound to the node starts, every claim in its `status.resourceClaimStatuses` or
  `spec.resourceClaims` is read; the Pod is added to each claim's Pod set, and a claim not yet
  prepared is prepared with `NodePrepareResources` on the plugin of the driver its allocation
  names, again and again (the Pod waits in ContainerCreating) until every claim answers without
  error; a claim another Pod already prepared is not prepared again (draclaims.py). Then each
  container gets the CDI ids of the devices its claim references match (`container_cdi`), and
  the Pod runs. The special claim of DRA extended resources (KEP-5004), named in the Pod's
  `status.extendedResourceClaimStatus`, is one of them, and its devices reach the containers
  its `requestMappings` name (draclaims.py);
- when the Pod's containers stop (deletion requested, after the termination delay), the Pod
  leaves its claims' sets; a claim no Pod uses any more is unprepared with
  `NodeUnprepareResources` (retried until it answers, also while no plugin of the driver is
  registered: the Pod stays Terminating meanwhile), then the deletion is completed;
- each registered driver's resource-health stream is followed (drahealth.py), and a running
  Pod's containers carry their claims' devices' health in `allocatedResourcesStatus`
  (resourcehealth.py), written again on every change (manager.go,
  `UpdateAllocatedResourcesStatus`, after a health update names one of the Pod's devices).

Kept apart from the device-plugin kubelet (`kubelet.py`); the two share only the `PodSource`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from partkeeper.kubelet import dra_pb2, dra_pb2_grpc, open_unix_channel
from partkeeper.lifecycle import cancel_all, woken_or_timeout
from partkeeper_sim.kubelet.draclaims import (
    EXTENDED,
    ClaimInfo,
    container_devices,
    extended_claim,
)
from partkeeper_sim.kubelet.drahealth import HealthStreams
from partkeeper_sim.kubelet.draplugins import WIPE_DELAY, DraPlugins
from partkeeper_sim.kubelet.pods import PodEvent, PodView
from partkeeper_sim.kubelet.resourcehealth import Statuses, dra_status
from partkeeper_sim.kubelet.source import PodSource

log = logging.getLogger(__name__)

CALL_TIMEOUT = 30.0


@dataclass
class Worker:
    pod: PodView
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    claims: list[str] = field(default_factory=list)  # UIDs of the claims this Pod joined
    attempts: int = 0
    error: str = ""
    running: bool = False
    cdi: dict[str, list[str]] = field(default_factory=dict)  # container -> CDI ids
    entries: dict[str, str] = field(default_factory=dict)  # the Pod's claim entry -> claim UID


# Per claim entry of a Pod: the claim's UID, and the (driver, ref) pairs to prepare it with.
Entries = dict[str, tuple[str, Any]]


class DraKubelet:
    def __init__(self, registry_dir: Path, source: PodSource, api_client: client.ApiClient, *,
                 node: str, termination_delay: float = 0.0, poll: float = 0.05,
                 retry: float = 0.1, wipe_delay: float = WIPE_DELAY) -> None:
        self.source = source
        self.resource = client.ResourceV1Api(api_client)
        self.registry = DraPlugins(registry_dir, node, api_client, poll=poll,
                                   wipe_delay=wipe_delay)
        self.termination_delay = termination_delay
        self.retry = retry
        self.workers: dict[str, Worker] = {}
        self.claims: dict[str, ClaimInfo] = {}  # claim UID -> what is prepared, for which Pods
        self.prepare_calls = 0
        self.unprepare_calls = 0
        self._tasks: list[asyncio.Task[None]] = []
        # driver -> (its registration, the channel to its service socket). kubelet keeps one
        # connection per registered plugin and reuses it for every call
        # (pkg/kubelet/cm/dra/plugin/dra_plugin.go, getOrCreateGRPCConn); gRPC reconnects it
        # by itself, and a new registration gets a new one.
        self._channels: dict[str, tuple[int, grpc.aio.Channel]] = {}
        self.health = HealthStreams(lambda: dict(self.registry.plugins),
                                    lambda d: self.registry.services.get(d, []),
                                    lambda d: self.registry.registrations.get(d, 0),
                                    self._health_changed, poll=poll)
        self.health_shown: dict[str, Statuses] = {}  # uid -> allocatedResourcesStatus written
        self._health_wake = asyncio.Event()

    @property
    def plugins(self) -> dict[str, str]:
        return self.registry.plugins

    async def __aenter__(self) -> DraKubelet:
        self._tasks = [asyncio.create_task(self.registry.run(), name="sim-kubelet dra reg"),
                       asyncio.create_task(self._pods(), name="sim-kubelet dra pods"),
                       asyncio.create_task(self.health.run(), name="sim-kubelet dra health"),
                       asyncio.create_task(self._health_writer(),
                                           name="sim-kubelet dra health status")]
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks = [*self._tasks, *(w.task for w in self.workers.values() if w.task)]
        await cancel_all(tasks)
        channels, self._channels = self._channels, {}
        for _, channel in channels.values():
            await channel.close()

    async def _stub(self, driver: str, socket: str) -> dra_pb2_grpc.DRAPluginStub:
        registration = self.registry.registrations.get(driver, 0)
        cached = self._channels.get(driver)
        if cached is not None and cached[0] == registration:
            return dra_pb2_grpc.DRAPluginStub(cached[1])
        channel = open_unix_channel(socket)
        self._channels[driver] = (registration, channel)  # before any await: one per driver
        if cached is not None:
            await cached[1].close()  # a call still on it fails, and is retried on this one
        return dra_pb2_grpc.DRAPluginStub(channel)

    # -- Pods ----------------------------------------------------------------------------------

    async def _pods(self) -> None:
        async for event in self.source.pods():
            self._on(event)

    def _on(self, event: PodEvent) -> None:
        pod = event.pod
        worker = self.workers.get(pod.uid)
        if event.kind == "deleted" or pod.deletion_requested or pod.finished:
            if worker is not None:
                worker.pod = pod
                worker.stop.set()
            return
        if worker is not None:
            worker.pod = pod  # the next attempt reads the claims' names from the newest copy
        elif pod.phase == "Pending":
            worker = Worker(pod)
            worker.task = asyncio.create_task(self._run(worker), name=f"sim-kubelet dra {pod.key}")
            self.workers[pod.uid] = worker

    async def _run(self, worker: Worker) -> None:
        pod = worker.pod
        try:
            while not worker.stop.is_set():
                if await self._attempt(worker):
                    worker.running = True
                    await self.source.set_phase(pod.uid, "Running", "", "")
                    self._health_changed()
                    break
                await woken_or_timeout(worker.stop, self.retry)
            await worker.stop.wait()
            if self.termination_delay:
                await asyncio.sleep(self.termination_delay)
            await self._leave_all(worker)
            if worker.pod.deletion_requested:
                await self.source.finalize_delete(pod.namespace, pod.name, pod.uid)
        finally:
            self.workers.pop(pod.uid, None)
            self.health_shown.pop(pod.uid, None)

    async def _attempt(self, worker: Worker) -> bool:
        try:
            return await self._prepare_all(worker)
        except (ApiException, OSError, ValueError) as exc:
            worker.error = f"reading the Pod's claims failed: {exc}"
            return False

    async def _read(self, pod: PodView) -> tuple[Mapping[str, Any], Entries] | None:
        """The Pod and, per claim entry, (claim UID, (driver, ref) list); None while a claim is
        not made or not allocated yet. The Pod is the watched copy, as kubelet's DRA manager
        takes it from the pod manager (pkg/kubelet/cm/dra/manager.go, `prepareResources`:
        `resourceclaim.Name(pod, ...)` on the Pod it was handed); each claim is read from the
        API server, as it `Get`s them."""
        body = pod.manifest
        statuses = {s.get("name"): s.get("resourceClaimName")
                    for s in (body.get("status") or {}).get("resourceClaimStatuses") or []}
        wanted = [(str(entry.get("name")),
                   entry.get("resourceClaimName") or statuses.get(entry.get("name")))
                  for entry in (body.get("spec") or {}).get("resourceClaims") or []]
        if extended_claim(body):
            wanted.append((EXTENDED, extended_claim(body)))
        found: Entries = {}
        for entry, name in wanted:
            if not name:
                return None
            raw = await asyncio.to_thread(self.resource.read_namespaced_resource_claim, name,
                                          pod.namespace, _preload_content=False)
            claim = json.loads(raw.data)
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                       or {}).get("results") or []
            if not results:
                return None
            ref = dra_pb2.Claim(namespace=pod.namespace, uid=claim["metadata"]["uid"], name=name)
            drivers = sorted({str(r.get("driver")) for r in results})
            found[entry] = (ref.uid, [(d, ref) for d in drivers])
        return body, found

    async def _prepare_all(self, worker: Worker) -> bool:
        worker.attempts += 1
        read = await self._read(worker.pod)
        if read is None:
            worker.error = "a claim is not allocated yet"
            return False
        body, entries = read
        for uid, refs in entries.values():
            for driver, ref in refs:
                info = self.claims.setdefault(uid, ClaimInfo(driver, ref))
                info.pods.add(worker.pod.uid)
                if uid not in worker.claims:
                    worker.claims.append(uid)
                if info.prepared:
                    continue  # prepared for another Pod already: once per claim
                error = await self._prepare(info)
                if error:
                    worker.error = error
                    return False
        worker.entries = {e: uid for e, (uid, _) in entries.items()}
        worker.cdi = container_devices(body, worker.entries, self.claims)
        worker.error = ""
        return True

    # -- device health in the Pod's status ----------------------------------------------

    def _health_changed(self) -> None:
        self._health_wake.set()

    async def _health_writer(self) -> None:
        while True:
            await self._health_wake.wait()
            self._health_wake.clear()
            try:
                await self._report_health()
            except Exception:  # the next change writes again; the node keeps going
                log.exception("writing the devices' health to Pod status failed")

    async def _report_health(self) -> None:
        now = time.monotonic()
        for uid, worker in list(self.workers.items()):
            if not worker.running or worker.stop.is_set():
                continue
            spec = worker.pod.manifest.get("spec") or {}
            devices = {}
            for entry, claim_uid in worker.entries.items():
                info = self.claims.get(claim_uid)
                if info is not None:
                    devices[entry] = [(info.driver, d.pool_name, d.device_name)
                                      for d in info.devices]
            statuses = {}
            for container in spec.get("containers") or []:
                entries = dra_status(container, devices, self.health.reported, now)
                if entries:
                    statuses[str(container.get("name"))] = entries
            if statuses and statuses != self.health_shown.get(uid):
                await self.source.set_resource_health(uid, statuses)
                self.health_shown[uid] = statuses  # only once written

    async def _prepare(self, info: ClaimInfo) -> str:
        socket = self.plugins.get(info.driver)
        if socket is None:
            return f"DRA driver {info.driver} is not registered"
        self.prepare_calls += 1
        try:
            stub = await self._stub(info.driver, socket)
            reply = await stub.NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(claims=[info.ref]), timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            return f"NodePrepareResources: {exc.code()} {exc.details()}"
        answer = reply.claims.get(info.ref.uid)
        if answer is None or answer.error:
            return answer.error if answer else f"no answer for claim {info.ref.uid}"
        info.devices, info.prepared = list(answer.devices), True
        return ""

    async def _leave_all(self, worker: Worker) -> None:
        for uid in list(worker.claims):
            info = self.claims.get(uid)
            worker.claims.remove(uid)
            if info is None:
                continue
            info.pods.discard(worker.pod.uid)
            if info.pods:
                continue  # another Pod of this node still uses the claim
            if info.prepared:
                await self._unprepare(info)
            self.claims.pop(uid, None)

    async def _unprepare(self, info: ClaimInfo) -> None:
        """Until the plugin answers without error. A driver that is not registered is an error
        like any other: kubelet unprepares after the containers stop and before it reports
        the Pod terminated, and retries the whole step (pkg/kubelet/kubelet.go,
        `SyncTerminatingPod`), so the Pod stays Terminating until a plugin of the driver
        answers."""
        ref = info.ref
        while True:
            socket = self.plugins.get(info.driver)
            if socket is None:
                log.warning("unprepare of %s waits: DRA driver %s is not registered", ref.name,
                            info.driver)
                await asyncio.sleep(self.retry)
                continue
            self.unprepare_calls += 1
            try:
                stub = await self._stub(info.driver, socket)
                reply = await stub.NodeUnprepareResources(
                    dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=CALL_TIMEOUT)
                answer = reply.claims.get(ref.uid)
                if answer is not None and not answer.error:
                    return
                log.warning("unprepare of %s failed: %s", ref.name, answer)
            except grpc.aio.AioRpcError as exc:
                log.warning("unprepare of %s failed: %s", ref.name, exc.code())
            await asyncio.sleep(self.retry)
