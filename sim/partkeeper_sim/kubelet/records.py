"""What the simulated kubelet remembers of each Pod: its state, and per container the devices
it holds and the plugin's Allocate answers."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from partkeeper.kubelet import deviceplugin_pb2
from partkeeper_sim.kubelet.pods import PodView


class PodState(enum.Enum):
    ADMITTING = "admitting"  # devices chosen so far are held
    RUNNING = "running"
    START_FAILED = "start_failed"  # admitted, PreStartContainer failed; devices stay held
    REJECTED = "rejected"  # failed admission
    TERMINATING = "terminating"  # deletion requested, containers stopping
    TERMINATED = "terminated"  # containers stopped


HOLDING = frozenset(
    {PodState.ADMITTING, PodState.RUNNING, PodState.START_FAILED, PodState.TERMINATING}
)


@dataclass
class ContainerRecord:
    name: str
    init: bool = False
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Chosen for an Allocate still in flight: held, but not yet reported by pod-resources.
    pending: dict[str, tuple[str, ...]] = field(default_factory=dict)
    responses: dict[str, deviceplugin_pb2.ContainerAllocateResponse] = field(default_factory=dict)


@dataclass
class PodRecord:
    pod: PodView
    state: PodState
    containers: dict[str, ContainerRecord]
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    finalized: bool = False
    gone: bool = False
    worker: asyncio.Task[None] | None = field(default=None, repr=False)
    # The status write in flight to the API server (the status manager lags behind the kubelet).
    status_write: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def holds_devices(self) -> bool:
        return self.state in HOLDING

    @property
    def active(self) -> bool:
        """Listed by pod-resources: kubelet lists only active (not terminated or rejected)
        Pods."""
        return self.state in HOLDING


def new_containers(pod: PodView) -> dict[str, ContainerRecord]:
    """Init containers first, as they run; pod-resources lists only the others."""
    inits = {c.name: ContainerRecord(c.name, init=True) for c in pod.init_containers}
    return inits | {c.name: ContainerRecord(c.name) for c in pod.containers}


def held_devices(records: Iterable[PodRecord]) -> dict[str, set[str]]:
    """Resource -> device IDs held by Pods in a holding state, Allocates in flight included."""
    taken: dict[str, set[str]] = {}
    for rec in records:
        if not rec.holds_devices:
            continue
        for container in rec.containers.values():
            for held in (container.devices, container.pending):
                for resource, ids in held.items():
                    taken.setdefault(resource, set()).update(ids)
    return taken
