"""Admission decisions of the simulated kubelet: pure functions of a Pod and a device snapshot.

Deterministic and free of side effects; `kubelet.SimKubelet` performs the calls they imply.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from partkeeper_sim.kubelet.pods import PodView, dra_mapped


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """`count` devices of `resource` for `container` (one Allocate call)."""

    container: str
    resource: str
    count: int
    init: bool = False  # an init container: its devices are reused by the containers after it


@dataclass(frozen=True, slots=True)
class Shortage:
    resource: str
    requested: int
    used: int
    capacity: int

    @property
    def reason(self) -> str:
        return f"OutOf{self.resource}"

    @property
    def message(self) -> str:
        return (
            f"Pod was rejected: Node didn't have enough resource: {self.resource}, "
            f"requested: {self.requested}, used: {self.used}, capacity: {self.capacity}"
        )


def device_requests(pod: PodView) -> list[DeviceRequest]:
    """One request per container and resource: init containers first, then the others, each in
    spec order, resources sorted (kubelet's device manager allocates in this order).

    Extended resources the Pod's `status.extendedResourceClaimStatus` maps to DRA requests
    are not the device plugins': kubelet's admission does not check them against the Node's
    allocatable nor allocate them, and its DRA manager prepares the special claim instead
    (KEP-5004, "Actuation for Extended Resource backed by DRA"; kubelet's admission predicates,
    pkg/kubelet/lifecycle/predicate.go)."""
    by_dra = dra_mapped(pod.manifest)
    inits = [
        DeviceRequest(c.name, resource, count, init=True)
        for c in pod.init_containers
        for resource, count in sorted(c.devices.items())
        if resource not in by_dra.get(c.name, ())
    ]
    return inits + [
        DeviceRequest(c.name, resource, count)
        for c in pod.containers
        for resource, count in sorted(c.devices.items())
        if resource not in by_dra.get(c.name, ())
    ]


def pod_wants(requests: Iterable[DeviceRequest]) -> dict[str, int]:
    """Devices the Pod needs at once per resource: init containers run one at a time and hand
    their devices on, so the larger of the largest init request and the sum of the others."""
    apps: dict[str, int] = {}
    inits: dict[str, int] = {}
    for request in requests:
        if request.init:
            inits[request.resource] = max(inits.get(request.resource, 0), request.count)
        else:
            apps[request.resource] = apps.get(request.resource, 0) + request.count
    return {r: max(apps.get(r, 0), inits.get(r, 0)) for r in sorted({*apps, *inits})}


def cpu_shortage(pod: PodView, used: int, capacity: int | None) -> str | None:
    """kubelet's OutOfcpu admission message, or None when the Pod's CPU request fits."""
    if capacity is None or pod.cpu_millis + used <= capacity:
        return None
    return (f"Pod was rejected: Node didn't have enough resource: cpu, requested: "
            f"{pod.cpu_millis}, used: {used}, capacity: {capacity}")


def reuse_first(reusable: Sequence[str], count: int) -> tuple[list[str], int]:
    """kubelet's devicesToReuse: what an init container left is taken first; (taken, still
    needed)."""
    taken = list(reusable[:count])
    return taken, count - len(taken)


def find_shortage(
    requests: Iterable[DeviceRequest],
    healthy: Mapping[str, Sequence[str]],
    taken: Mapping[str, set[str]],
) -> Shortage | None:
    """The first resource (by name) of which the Pod wants more than is Healthy and free."""
    wanted = pod_wants(requests)
    for resource in sorted(wanted):
        ids = healthy.get(resource, ())
        used = len(taken.get(resource, set()).intersection(ids))
        if wanted[resource] > len(ids) - used:
            return Shortage(resource, wanted[resource], used, len(ids))
    return None


def free_devices(healthy: Iterable[str], taken: set[str]) -> list[str]:
    """Healthy devices nobody holds, lowest first."""
    return sorted((i for i in healthy if i not in taken), key=natural_key)


def choose(available: Sequence[str], count: int, preferred: Sequence[str] = ()) -> list[str]:
    """`count` of `available`: the plugin's preferred ones that are available, then lowest first.

    A preference naming unknown or taken devices is ignored for those devices, as kubelet treats
    GetPreferredAllocation as advice.
    """
    if count > len(available):
        raise ValueError(f"{count} devices wanted, {len(available)} available")
    offered = set(available)
    chosen: list[str] = []
    for device in (*preferred, *sorted(available, key=natural_key)):
        if len(chosen) == count:
            break
        if device in offered and device not in chosen:
            chosen.append(device)
    return chosen


_DIGITS = re.compile(r"(\d+)")


def natural_key(device_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key under which `dev-2` comes before `dev-10`."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in _DIGITS.split(device_id) if part
    )
