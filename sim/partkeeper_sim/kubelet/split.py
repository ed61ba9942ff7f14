"""One node's Pods split between the simulated kubelet's two managers, when both run (the
cluster's `both` mode: a node moving between device plugins and DRA).

The real kubelet runs its device manager and its DRA manager side by side on every Pod
(pkg/kubelet/cm/container_manager_linux.go); the simulated kubelet keeps them as two loops, so
each Pod goes to exactly one: to the DRA side when it has ResourceClaims or the special claim of
DRA extended resources in `status.extendedResourceClaimStatus` (which the scheduler writes before
it binds, so the first sight of a bound Pod already shows it), to the device-plugin side
otherwise. A Pod using both a device plugin and DRA is not modelled.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from partkeeper_sim.kubelet.draclaims import extended_claim
from partkeeper_sim.kubelet.pods import PodEvent, PodView
from partkeeper_sim.kubelet.resourcehealth import Statuses
from partkeeper_sim.kubelet.source import PodSource


def uses_dra(pod: PodView) -> bool:
    spec = pod.manifest.get("spec") or {}
    return bool(spec.get("resourceClaims")) or bool(extended_claim(pod.manifest))


class SplitSource:
    """The Pods of `inner` that `keep` accepts; the writes go to `inner`."""

    def __init__(self, inner: PodSource, keep: Callable[[PodView], bool]) -> None:
        self._inner = inner
        self._keep = keep

    async def pods(self) -> AsyncIterator[PodEvent]:
        async for event in self._inner.pods():
            if self._keep(event.pod):
                yield event

    async def set_phase(self, uid: str, phase: str, reason: str, message: str) -> None:
        await self._inner.set_phase(uid, phase, reason, message)

    async def set_resource_health(self, uid: str, health: Statuses) -> None:
        await self._inner.set_resource_health(uid, health)

    async def finalize_delete(self, namespace: str, name: str, uid: str) -> None:
        await self._inner.finalize_delete(namespace, name, uid)
