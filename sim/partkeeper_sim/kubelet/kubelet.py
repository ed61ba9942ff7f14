"""The simulated kubelet: device-plugin registration, Pod admission, device accounting, freeing.

Pod events are handled one at a time, as kubelet's sync loop does: admission (including the
plugin's Allocate) runs inline, so a slow Allocate delays the handling of every later Pod event.
Stopping a deleted Pod's containers runs in a per-Pod worker, as kubelet's pod workers do.
Devices are held by Pods in a holding state (`HOLDING`); the moment a Pod stops they are free for
the next admission, before the plugin has had any chance to tidy up, and before its status has
reached the API server (`status_lag`, see status.py). A container whose reply names a device host
path the runtime cannot use fails to start (runtime.py), as containerd fails it. Admission follows
kubelet's order: a Pod the node cannot fit otherwise (OutOfcpu) is rejected before any device is
allocated; then each init container, then each other container, is allocated its devices, those
of an init container being reused by the containers after it (kubelet's device manager calls
Allocate again with them). Pods are admitted in the order the source delivers them (binding
order), whatever their creation times say. A running Pod's containers carry their devices' health
as the plugins' ListAndWatch last gave it (`allocatedResourcesStatus`, resourcehealth.py), written
again on every change, as kubelet's device manager sends a health change to the status manager.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from partkeeper.kubelet import deviceplugin_pb2
from partkeeper.lifecycle import cancel_all
from partkeeper.telemetry import tracing
from partkeeper.telemetry.logs import decision
from partkeeper_sim.kubelet.admission import (
    DeviceRequest,
    choose,
    cpu_shortage,
    device_requests,
    find_shortage,
    free_devices,
    reuse_first,
)
from partkeeper_sim.kubelet.changes import Changes
from partkeeper_sim.kubelet.plugins import PluginCallError, PluginRegistry
from partkeeper_sim.kubelet.podresources import PodAssignment, PodResourcesServer
from partkeeper_sim.kubelet.pods import PodEvent, PodView
from partkeeper_sim.kubelet.records import (
    PodRecord,
    PodState,
    held_devices,
    new_containers,
)
from partkeeper_sim.kubelet.resourcehealth import Statuses, device_plugin_status
from partkeeper_sim.kubelet.runtime import create_error
from partkeeper_sim.kubelet.source import PodSource
from partkeeper_sim.kubelet.status import StatusManager

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)

UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
CREATE_CONTAINER_ERROR = "CreateContainerError"


class AdmissionError(RuntimeError):
    """kubelet could not give a container its devices; the Pod fails admission."""


class SimKubelet:
    """A kubelet for one node, fed by a `PodSource`.

    `kubelet_dir` holds kubelet.sock and the plugins' sockets; `pod_resources_socket`, when given,
    serves pod-resources v1. `termination_delay` is how long a deleted Pod's containers take to
    stop (its grace period); during it the Pod is terminating and keeps its devices.
    `status_lag` delays every status write to the API server; `cpu_millis` is the node's
    allocatable CPU (None: unlimited), against which Pods are admitted or rejected OutOfcpu.
    """

    def __init__(
        self,
        kubelet_dir: Path,
        source: PodSource,
        *,
        pod_resources_socket: Path | None = None,
        termination_delay: float = 0.0,
        allocate_timeout: float | None = None,
        connect_timeout: float = 10.0,
        clean_plugin_sockets: bool = True,
        status_lag: float = 0.0,
        cpu_millis: int | None = None,
    ) -> None:
        self._source = source
        self._changes = Changes()
        self._plugins = PluginRegistry(
            Path(kubelet_dir),
            self._changes.touch,
            connect_timeout=connect_timeout,
            clean_plugin_sockets=clean_plugin_sockets,
        )
        self._podres = (
            PodResourcesServer(Path(pod_resources_socket), self.assignments, self.allocatable)
            if pod_resources_socket is not None
            else None
        )
        self._status = StatusManager(source, status_lag)
        self._cpu_millis = cpu_millis
        self._termination_delay = termination_delay
        self._allocate_timeout = allocate_timeout
        self._pods: dict[str, PodRecord] = {}
        self._gone: deque[PodRecord] = deque(maxlen=256)
        self._sync_task: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None
        self.health_shown: dict[str, Statuses] = {}  # uid -> allocatedResourcesStatus written
        self.sync_error: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self._plugins.start()
        if self._podres is not None:
            await self._podres.start()
        self._sync_task = asyncio.create_task(self._sync_loop(), name="sim-kubelet sync loop")
        self._health_task = asyncio.create_task(self._health_loop(), name="sim-kubelet health")

    async def stop(self) -> None:
        tasks = [r.worker for r in self._pods.values() if r.worker and not r.worker.done()]
        if self._sync_task is not None:
            tasks.append(self._sync_task)
            self._sync_task = None
        if self._health_task is not None:
            tasks.append(self._health_task)
            self._health_task = None
        await cancel_all(tasks)
        await self._status.stop()
        await self._plugins.stop()
        if self._podres is not None:
            await self._podres.stop()

    async def restart(self) -> None:
        """Re-create kubelet.sock as a restarting kubelet does, so plugins must register again.

        Pods and their device assignments survive (kubelet keeps them in its checkpoint); the
        plugins' connections and device lists do not, and plugin sockets are deleted.
        """
        await self._plugins.restart()

    async def __aenter__(self) -> SimKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- what tests and the stack read -----------------------------------------------------

    @property
    def kubelet_socket(self) -> Path:
        return self._plugins.socket_path

    @property
    def registrations(self) -> list[deviceplugin_pb2.RegisterRequest]:
        return list(self._plugins.registrations)

    @property
    def connect_errors(self) -> list[str]:
        return list(self._plugins.connect_errors)

    def devices(self, resource: str) -> dict[str, str]:
        """Device ID -> health, as the resource's plugin last listed them."""
        endpoint = self._plugins.endpoints.get(resource)
        return dict(endpoint.devices) if endpoint else {}

    def options(self, resource: str) -> deviceplugin_pb2.DevicePluginOptions | None:
        endpoint = self._plugins.endpoints.get(resource)
        return endpoint.options if endpoint else None

    def free(self, resource: str) -> list[str]:
        """Healthy devices of `resource` no Pod holds: what the next admission may use."""
        taken = held_devices(self._pods.values()).get(resource, set())
        return free_devices(self._plugins.healthy(resource), taken)

    def record(self, uid: str) -> PodRecord | None:
        """The kubelet's record of a Pod, also for a while after the Pod object is gone."""
        if uid in self._pods:
            return self._pods[uid]
        return next((r for r in reversed(self._gone) if r.pod.uid == uid), None)

    @property
    def status_lag(self) -> float:
        return self._status.lag

    @status_lag.setter
    def status_lag(self, seconds: float) -> None:
        """How long later status writes take to reach the API server (a test may vary it)."""
        self._status.lag = seconds

    def assignments(self) -> list[PodAssignment]:
        """What pod-resources lists: active Pods only (not rejected or terminated), and their
        app containers."""
        return [
            PodAssignment(
                rec.pod.namespace,
                rec.pod.name,
                {c.name: dict(c.devices) for c in rec.containers.values() if not c.init},
            )
            for rec in self._pods.values()
            if rec.active
        ]

    def allocatable(self) -> dict[str, list[str]]:
        return {r: sorted(self._plugins.healthy(r)) for r in self._plugins.endpoints}

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Return once `predicate()` holds after some change; TimeoutError after `timeout` s."""
        await self._changes.wait_for(predicate, timeout)

    # -- telling the kubelet that containers exited ----------------------------------------

    async def finish(
        self, uid: str, phase: str = "Succeeded", reason: str = "", message: str = ""
    ) -> None:
        """The Pod's containers exited: free its devices now and report `phase`."""
        rec = self._pods.get(uid)
        if rec is None:
            raise KeyError(f"the kubelet has no Pod with uid {uid}")
        match rec.state:
            case PodState.RUNNING | PodState.START_FAILED:
                self._set_state(rec, PodState.TERMINATED)
                await self._report(rec, phase, reason, message)
            case _:
                raise ValueError(f"Pod {rec.pod.key} ({uid}) is {rec.state.value}, not running")

    # -- the sync loop ---------------------------------------------------------------------

    async def _sync_loop(self) -> None:
        try:
            async for event in self._source.pods():
                await self._handle_safely(event)
        except Exception as exc:
            self.sync_error = exc
            log.exception("the Pod source failed; the kubelet handles no more Pod events")
            self._changes.touch()

    async def _handle_safely(self, event: PodEvent) -> None:
        try:
            await self._handle(event)
        except Exception:
            # One bad event must not stop the node: later Pods still need admitting and freeing.
            log.exception("handling %s of Pod %s failed", event.kind, event.pod.uid)

    async def _handle(self, event: PodEvent) -> None:
        rec = self._pods.get(event.pod.uid)
        if event.kind == "deleted":
            self._on_deleted(event.pod, rec)
        elif rec is None:
            await self._on_new(event.pod)
        else:
            rec.pod = event.pod
            self._on_update(rec)

    async def _on_new(self, pod: PodView) -> None:
        if not (pod.finished or pod.deletion_requested or pod.phase == "Running"):
            await self._admit(pod)
            return
        running = pod.phase == "Running" and not pod.finished
        state = PodState.RUNNING if running else PodState.TERMINATED
        rec = PodRecord(pod, state, new_containers(pod), phase=pod.phase)
        self._pods[pod.uid] = rec
        if state is PodState.RUNNING:
            # No checkpoint survives this process, so its earlier device assignment is unknown.
            log.warning("Pod %s (%s) already running; adopted without devices", pod.key, pod.uid)
        self._changes.touch()
        self._on_update(rec)

    def _on_update(self, rec: PodRecord) -> None:
        pod = rec.pod
        match rec.state:
            case PodState.ADMITTING | PodState.TERMINATING:
                return
            case PodState.RUNNING | PodState.START_FAILED:
                if pod.deletion_requested:
                    self._spawn(rec, self._terminate(rec))
                elif pod.finished:
                    decision(log, f"Pod finished as {pod.phase}; devices freed", **_ids(rec))
                    rec.phase = pod.phase
                    self._set_state(rec, PodState.TERMINATED)
            case PodState.REJECTED | PodState.TERMINATED:
                if pod.deletion_requested and not rec.finalized:
                    self._spawn(rec, self._finalize(rec))
            case _:
                raise AssertionError(f"Pod {pod.uid} in unknown state {rec.state!r}")

    def _on_deleted(self, pod: PodView, rec: PodRecord | None) -> None:
        if rec is None:
            return
        if rec.state is PodState.TERMINATING and rec.worker is not None:
            rec.worker.cancel()  # force-deleted during its grace period
        if rec.holds_devices:
            self._set_state(rec, PodState.TERMINATED)
        rec.pod, rec.gone = pod, True
        self._gone.append(self._pods.pop(pod.uid))
        decision(log, "Pod object is gone", **_ids(rec))
        self._changes.touch()

    # -- device health in the Pod's status --------------------------------------------------

    async def _health_loop(self) -> None:
        """Write each running Pod's allocatedResourcesStatus whenever it changes."""
        while True:
            seen = self._changes.count
            try:
                await self._report_health()
            except Exception:  # the next change writes again; the node keeps going
                log.exception("writing the devices' health to Pod status failed")
            await self._changes.since(seen)

    async def _report_health(self) -> None:
        running = {uid: rec for uid, rec in self._pods.items() if rec.state is PodState.RUNNING}
        for uid in set(self.health_shown) - set(running):
            del self.health_shown[uid]
        for uid, rec in running.items():
            statuses = {}
            for container in rec.containers.values():
                if container.init:
                    continue
                listed = {r: self.devices(r) for r in container.devices}
                entries = device_plugin_status(container.devices, listed)
                if entries:
                    statuses[container.name] = entries
            if statuses and statuses != self.health_shown.get(uid):
                await self._source.set_resource_health(uid, statuses)
                self.health_shown[uid] = statuses  # only once written

    # -- admission -------------------------------------------------------------------------

    async def _admit(self, pod: PodView) -> None:
        # The plugin calls carry this span (plugins.py): unlike kubelet's, Allocate joins it.
        ids = {"pk.pod_uid": pod.uid, "pk.pod": pod.key}
        with _tracer.start_as_current_span("kubelet admit", attributes=ids):
            await self._admission(pod)

    async def _admission(self, pod: PodView) -> None:
        rec = PodRecord(pod, PodState.ADMITTING, new_containers(pod))
        self._pods[pod.uid] = rec
        self._changes.touch()
        others = (r for r in self._pods.values() if r.holds_devices and r is not rec)
        refused = cpu_shortage(pod, sum(r.pod.cpu_millis for r in others), self._cpu_millis)
        if refused is not None:
            await self._reject(rec, "OutOfcpu", refused)
            return
        requests = device_requests(pod)
        healthy = {r.resource: self._plugins.healthy(r.resource) for r in requests}
        shortage = find_shortage(requests, healthy, held_devices(self._pods.values()))
        if shortage is not None:
            await self._reject(rec, shortage.reason, shortage.message)
            return
        reusable: dict[str, list[str]] = {}  # devices init containers left for the next ones
        try:
            for request in requests:
                await self._allocate(rec, request, reusable)
        except (AdmissionError, PluginCallError) as exc:
            message = f"Allocate failed due to {exc}, which is unexpected"
            await self._reject(rec, UNEXPECTED_ADMISSION_ERROR, message)
            return
        await self._start_containers(rec)

    async def _allocate(
        self, rec: PodRecord, request: DeviceRequest, reusable: dict[str, list[str]]
    ) -> None:
        resource = request.resource
        endpoint = self._plugins.endpoints.get(resource)
        if endpoint is None or not endpoint.connected:
            raise AdmissionError(f"can't allocate unregistered device {resource}")
        pool = reusable.get(resource, [])
        reused, needed = reuse_first(pool, request.count)
        available = self.free(resource)
        if len(available) < needed:
            raise AdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {request.count}, Available: {len(available) + len(reused)}"
            )
        preferred: list[str] = []
        if needed and endpoint.options.get_preferred_allocation_available:
            preferred = await endpoint.preferred(available, needed)
        ids = tuple(reused + (choose(available, needed, preferred) if needed else []))
        if request.init:
            reusable[resource] = list(dict.fromkeys([*pool, *ids]))
        else:
            reusable[resource] = [d for d in pool if d not in ids]
        container = rec.containers[request.container]
        container.pending[resource] = ids
        self._changes.touch()
        try:
            response = await endpoint.allocate(ids, self._allocate_timeout)
        finally:
            del container.pending[resource]
        container.devices[resource] = ids
        container.responses[resource] = response
        decision(
            log,
            "Allocate succeeded",
            **_ids(rec),
            container=container.name,
            resource=resource,
            devices=",".join(ids),
        )
        self._changes.touch()

    async def _start_containers(self, rec: PodRecord) -> None:
        for container in rec.containers.values():
            for resource, ids in container.devices.items():
                endpoint = self._plugins.endpoints.get(resource)
                if endpoint is None or not endpoint.options.pre_start_required:
                    continue
                try:
                    await endpoint.pre_start(ids)
                except PluginCallError as exc:
                    await self._start_failed(rec, str(exc))
                    return
        # Then the runtime creates each container from its device specs (runtime.py).
        for container in rec.containers.values():
            problem = create_error(container.responses.values())
            if problem is not None:
                await self._start_failed(rec, f"container {container.name}: {problem}")
                return
        self._set_state(rec, PodState.RUNNING)
        await self._report(rec, "Running", "", "")

    async def _start_failed(self, rec: PodRecord, message: str) -> None:
        """Admitted, but a container cannot be created: Pending, devices kept."""
        decision(log, f"container start failed: {message}", **_ids(rec))
        self._set_state(rec, PodState.START_FAILED)
        await self._report(rec, "Pending", CREATE_CONTAINER_ERROR, message)

    async def _reject(self, rec: PodRecord, reason: str, message: str) -> None:
        decision(log, f"Pod rejected: {message}", **_ids(rec), reason=reason)
        self._set_state(rec, PodState.REJECTED)
        await self._report(rec, "Failed", reason, message)

    # -- termination -----------------------------------------------------------------------

    async def _terminate(self, rec: PodRecord) -> None:
        started = rec.state is PodState.RUNNING
        self._set_state(rec, PodState.TERMINATING)
        if self._termination_delay > 0:
            await asyncio.sleep(self._termination_delay)  # the modelled grace period
        self._set_state(rec, PodState.TERMINATED)
        decision(log, "Pod containers stopped; devices freed", **_ids(rec))
        if started:
            await self._report(rec, "Succeeded", "", "")
        else:
            await self._report(rec, "Failed", rec.reason, rec.message)
        await self._finalize(rec)

    async def _finalize(self, rec: PodRecord) -> None:
        if rec.finalized:
            return
        await self._status.written(rec)  # the terminal status first, then the final delete
        try:
            await self._source.finalize_delete(rec.pod.namespace, rec.pod.name, rec.pod.uid)
        except Exception as exc:
            # The object may already be gone; the next event for it retries if it is not.
            log.warning("deleting Pod %s (%s) failed: %r", rec.pod.key, rec.pod.uid, exc)
            return
        rec.finalized = True
        self._changes.touch()

    # -- helpers ---------------------------------------------------------------------------

    def _spawn(self, rec: PodRecord, work: Coroutine[Any, Any, None]) -> None:
        if rec.worker is not None and not rec.worker.done():
            work.close()
            return
        rec.worker = asyncio.create_task(work, name=f"sim-kubelet pod {rec.pod.uid}")

    def _set_state(self, rec: PodRecord, state: PodState) -> None:
        rec.state = state
        self._changes.touch()

    async def _report(self, rec: PodRecord, phase: str, reason: str, message: str) -> None:
        rec.phase, rec.reason, rec.message = phase, reason, message
        self._changes.touch()
        await self._status.report(rec, phase, reason, message)


def _ids(rec: PodRecord) -> dict[str, str]:
    return {"pod_uid": rec.pod.uid, "pod": rec.pod.key}
