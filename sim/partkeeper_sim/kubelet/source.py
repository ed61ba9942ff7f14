"""The simulated kubelet's port to the cluster: where Pods come from and where status goes.

`PodSource` is all the kubelet needs; `MemoryPodSource` implements it in process (tests, and a
cluster without an API server), `cluster.ClusterPodSource` on the Kubernetes API.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from partkeeper_sim.kubelet.changes import Changes
from partkeeper_sim.kubelet.pods import PodEvent, PodView, pod_from_manifest
from partkeeper_sim.kubelet.resourcehealth import Statuses


@runtime_checkable
class PodSource(Protocol):
    """Pods bound to one node, and the two writes a kubelet makes."""

    def pods(self) -> AsyncIterator[PodEvent]:
        """Every Pod bound to the node as an upsert, then each change, in order, until closed."""
        ...

    async def set_phase(self, uid: str, phase: str, reason: str, message: str) -> None:
        """Report the Pod's phase (and why) in its status."""
        ...

    async def set_resource_health(self, uid: str, health: Statuses) -> None:
        """Report the containers' allocatedResourcesStatus (resourcehealth.py)."""
        ...

    async def finalize_delete(self, namespace: str, name: str, uid: str) -> None:
        """Remove a Pod whose deletion was requested, once its containers have stopped."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class PhaseReport:
    phase: str
    reason: str
    message: str


class MemoryPodSource:
    """An in-process API for one node: Pods are added, deleted and reported on here.

    Follows the API server's delete semantics: `request_delete` only marks the Pod (the
    deletionTimestamp), the kubelet's `finalize_delete` removes it and emits `deleted`;
    `force_delete` removes it at once. Status writes come back as upserts, as a watch would.
    """

    def __init__(self) -> None:
        self._pods: dict[str, PodView] = {}
        self._events: asyncio.Queue[PodEvent] = asyncio.Queue()
        self._changes = Changes()
        self.reports: dict[str, list[PhaseReport]] = {}
        self.finalized: list[str] = []
        self.health: dict[str, Statuses] = {}  # uid -> the last allocatedResourcesStatus

    # -- the cluster side ------------------------------------------------------------------

    def add(self, pod: PodView | Mapping[str, Any]) -> PodView:
        view = pod if isinstance(pod, PodView) else pod_from_manifest(pod)
        if view.uid in self._pods:
            raise ValueError(f"Pod {view.key} ({view.uid}) already exists")
        self._emit("upsert", view)
        return view

    def request_delete(self, uid: str) -> None:
        self._emit("upsert", dataclasses.replace(self._get(uid), deletion_requested=True))

    def force_delete(self, uid: str) -> None:
        self._emit("deleted", self._get(uid))

    def pod(self, uid: str) -> PodView | None:
        return self._pods.get(uid)

    def last_report(self, uid: str) -> PhaseReport | None:
        reports = self.reports.get(uid)
        return reports[-1] if reports else None

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Return once `predicate()` holds; TimeoutError after `timeout` seconds."""
        await self._changes.wait_for(predicate, timeout)

    # -- the PodSource side ----------------------------------------------------------------

    async def pods(self) -> AsyncIterator[PodEvent]:
        while True:
            yield await self._events.get()

    async def set_phase(self, uid: str, phase: str, reason: str, message: str) -> None:
        self.reports.setdefault(uid, []).append(PhaseReport(phase, reason, message))
        if uid in self._pods:
            self._emit("upsert", dataclasses.replace(self._pods[uid], phase=phase))
        else:
            self._touch()

    async def set_resource_health(self, uid: str, health: Statuses) -> None:
        self.health[uid] = health
        self._touch()

    async def finalize_delete(self, namespace: str, name: str, uid: str) -> None:
        pod = self._pods.get(uid)
        if pod is None or pod.key != f"{namespace}/{name}":
            return
        self.finalized.append(uid)
        self._emit("deleted", pod)

    # -- internals -------------------------------------------------------------------------

    def _get(self, uid: str) -> PodView:
        try:
            return self._pods[uid]
        except KeyError:
            raise KeyError(f"no Pod with uid {uid}") from None

    def _emit(self, kind: str, pod: PodView) -> None:
        if kind == "deleted":
            self._pods.pop(pod.uid, None)
            self._events.put_nowait(PodEvent("deleted", pod))
        else:
            self._pods[pod.uid] = pod
            self._events.put_nowait(PodEvent("upsert", pod))
        self._touch()

    def _touch(self) -> None:
        self._changes.touch()
