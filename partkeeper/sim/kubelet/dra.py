"""The simulated kubelet's DRA side: plugin registration and Node(Un)PrepareResources.

As kubelet's plugin manager and DRA manager do:

- a socket appearing in the `plugins_registry` dir is asked `GetInfo`; a `DRAPlugin` offering
  `v1.DRAPlugin` is told it is registered and its service socket remembered by driver name;
- before a Pod bound to the node starts, every claim in its `status.resourceClaimStatuses` or
  `spec.resourceClaims` is read; the claims are prepared with `NodePrepareResources` on the
  plugin of the driver each one's allocation names, again and again (the Pod waits in
  ContainerCreating) until every claim answers without error; then the Pod runs;
- when the Pod's containers stop (deletion requested, after the termination delay), its claims are
  unprepared with `NodeUnprepareResources` (retried until they answer), then the deletion is
  completed.

Kept apart from the device-plugin kubelet (`kubelet.py`); the two share only the `PodSource`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from partkeeper.kubelet import (
    dra_pb2,
    dra_pb2_grpc,
    dra_registration_pb2,
    dra_registration_pb2_grpc,
    open_unix_channel,
)
from partkeeper.sim.kubelet.pods import PodEvent, PodView
from partkeeper.sim.kubelet.source import PodSource

log = logging.getLogger(__name__)

DRA_PLUGIN = "DRAPlugin"
DRA_VERSION = "v1.DRAPlugin"
CALL_TIMEOUT = 30.0


@dataclass
class Worker:
    pod: PodView
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    prepared: list[tuple[str, dra_pb2.Claim]] = field(default_factory=list)  # (driver, claim)
    attempts: int = 0
    error: str = ""
    running: bool = False


class DraKubelet:
    def __init__(self, registry_dir: Path, source: PodSource, api_client: client.ApiClient, *,
                 termination_delay: float = 0.0, poll: float = 0.05, retry: float = 0.1) -> None:
        self.registry_dir = Path(registry_dir)
        self.source = source
        self.core = client.CoreV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.termination_delay = termination_delay
        self.poll = poll
        self.retry = retry
        self.plugins: dict[str, str] = {}  # driver -> service socket
        self.workers: dict[str, Worker] = {}
        self.prepare_calls = 0
        self.unprepare_calls = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> DraKubelet:
        self._tasks = [asyncio.create_task(self._registrations(), name="sim-kubelet dra reg"),
                       asyncio.create_task(self._pods(), name="sim-kubelet dra pods")]
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks = [*self._tasks, *(w.task for w in self.workers.values() if w.task)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- registration --------------------------------------------------------------------------

    async def _registrations(self) -> None:
        seen: set[str] = set()
        while True:
            sockets = await asyncio.to_thread(_sockets, self.registry_dir)
            for path in sockets:
                if str(path) not in seen and await self._register(path):
                    seen.add(str(path))
            seen &= {str(p) for p in sockets}
            await asyncio.sleep(self.poll)

    async def _register(self, path: Path) -> bool:
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
            return False
        if ok:
            self.plugins[info.name] = info.endpoint
            log.info("registered DRA plugin %s at %s", info.name, info.endpoint)
        return True

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
        if worker is None and pod.phase == "Pending":
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
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(worker.stop.wait(), self.retry)
            await worker.stop.wait()
            if self.termination_delay:
                await asyncio.sleep(self.termination_delay)
            await self._unprepare_all(worker)
            if worker.pod.deletion_requested:
                await self.source.finalize_delete(pod.namespace, pod.name, pod.uid)
        finally:
            self.workers.pop(pod.uid, None)

    async def _attempt(self, worker: Worker) -> bool:
        try:
            return await self._prepare_all(worker)
        except (ApiException, OSError, ValueError) as exc:
            worker.error = f"reading the Pod's claims failed: {exc}"
            return False

    async def _claims(self, pod: PodView) -> list[tuple[str, dra_pb2.Claim]] | None:
        """(driver, claim) for each of the Pod's claims, or None while one is not allocated."""
        raw = await asyncio.to_thread(self.core.read_namespaced_pod, pod.name, pod.namespace,
                                      _preload_content=False)
        body = json.loads(raw.data)
        entries = (body.get("spec") or {}).get("resourceClaims") or []
        statuses = {s.get("name"): s.get("resourceClaimName")
                    for s in (body.get("status") or {}).get("resourceClaimStatuses") or []}
        found = []
        for entry in entries:
            name = entry.get("resourceClaimName") or statuses.get(entry.get("name"))
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
            for driver in sorted({r.get("driver") for r in results}):
                found.append((driver, ref))
        return found

    async def _prepare_all(self, worker: Worker) -> bool:
        worker.attempts += 1
        claims = await self._claims(worker.pod)
        if claims is None:
            worker.error = "a claim is not allocated yet"
            return False
        for driver, ref in claims:
            socket = self.plugins.get(driver)
            if socket is None:
                worker.error = f"DRA driver {driver} is not registered"
                return False
            self.prepare_calls += 1
            try:
                async with open_unix_channel(socket) as channel:
                    reply = await dra_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                        dra_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                worker.error = f"NodePrepareResources: {exc.code()} {exc.details()}"
                return False
            answer = reply.claims.get(ref.uid)
            if answer is None or answer.error:
                worker.error = answer.error if answer else f"no answer for claim {ref.uid}"
                return False
            if (driver, ref) not in worker.prepared:
                worker.prepared.append((driver, ref))
        worker.error = ""
        return True

    async def _unprepare_all(self, worker: Worker) -> None:
        for driver, ref in list(worker.prepared):
            socket = self.plugins.get(driver)
            while socket is not None:
                self.unprepare_calls += 1
                try:
                    async with open_unix_channel(socket) as channel:
                        reply = await dra_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                            dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]),
                            timeout=CALL_TIMEOUT)
                    answer = reply.claims.get(ref.uid)
                    if answer is not None and not answer.error:
                        break
                    log.warning("unprepare of %s failed: %s", ref.name, answer)
                except grpc.aio.AioRpcError as exc:
                    log.warning("unprepare of %s failed: %s", ref.name, exc.code())
                await asyncio.sleep(self.retry)
            worker.prepared.remove((driver, ref))


def _sockets(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith("-reg.sock"))
    except FileNotFoundError:
        return []
