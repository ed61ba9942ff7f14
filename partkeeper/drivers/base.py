"""The driver interface: what partkeeper needs from a partitionable accelerator.

Two implementations: `sim` (a faithful MIG model in a shared JSON state file) and `nvml`. The
interface is synchronous, because NVML is; services call it through `asyncio.to_thread`.

A spec (card, profile, start) says what a partition should be and nothing about existence; an
`Instance` is the live identity the driver reports once the hardware exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from partkeeper.devices import DeviceNode
from partkeeper.errors import StartupError

Mode = Literal["partition", "sliced"]


@dataclass(frozen=True, slots=True)
class Card:
    index: int
    uuid: str
    model: str
    mode: Mode
    memory_mib: int
    minor: int | None = None  # the device node's minor (/dev/nvidia<minor>); None: the index
    problem: str = ""  # why the driver offers no profile on a card of a known model ("": none)


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    card: int
    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class Instance:
    card: int
    profile: str
    start: int
    size: int
    gi_id: int
    ci_id: int
    uuid: str

    @property
    def spec(self) -> InstanceSpec:
        return InstanceSpec(self.card, self.profile, self.start)

    @property
    def placement(self) -> tuple[int, int]:
        return (self.start, self.size)

    @property
    def complete(self) -> bool:
        """Whether the partition has its compute instance (and so its UUID). A GPU instance
        without one is what a create or destroy interrupted between its two steps leaves."""
        return self.ci_id >= 0 and bool(self.uuid)


def same_partition(recorded: Instance, listed: Instance) -> bool:
    """Whether `listed` is the partition recorded as `recorded`: the same UUID and GI id, or,
    once a destroy removed the compute instance and stopped before the GPU instance, the GPU
    instance of that GI id, profile and start, left without a compute instance."""
    if (listed.uuid, listed.gi_id) == (recorded.uuid, recorded.gi_id):
        return True
    where = (listed.card, listed.gi_id, listed.profile, listed.start)
    return not listed.complete and where == (
        recorded.card, recorded.gi_id, recorded.profile, recorded.start
    )


@dataclass(frozen=True, slots=True)
class HostMount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """What a container needs to use its partitions, as the vendor's runtime expects it.

    The Allocate reply (and a CDI spec, where that mode is on) carries exactly this."""

    env: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[DeviceNode, ...] = ()
    mounts: tuple[HostMount, ...] = ()


def nvidia_edits(instances: Sequence[Instance]) -> ContainerEdits:
    """NVIDIA's (and the sim's): the container runtime hook takes the MIG UUIDs from the env."""
    return ContainerEdits(env={"NVIDIA_VISIBLE_DEVICES": ",".join(i.uuid for i in instances)})


class DriverError(Exception):
    """A driver operation failed. Names the operation, the card, the instance and the cause."""

    kind = "error"

    def __init__(self, op: str, card: int | None, instance: str | None, cause: str) -> None:
        self.op = op
        self.card = card
        self.instance = instance
        self.cause = cause
        where = f"card {card}" if card is not None else "driver"
        if instance:
            where += f", instance {instance}"
        super().__init__(f"{op} failed on {where}: {cause}")


class InUseError(DriverError):
    """The instance has running processes; the driver refuses to destroy it."""

    kind = "in_use"


class NotFoundError(DriverError):
    """The driver positively reports the instance absent (not a failed read)."""

    kind = "not_found"


class ReadError(DriverError):
    """An enumeration failed or was partial. Never to be taken as 'absent' (fail closed)."""

    kind = "read_failed"


class PlacementError(DriverError):
    """The requested placement is illegal for the profile or overlaps an existing instance."""

    kind = "placement"


class IdentityMismatchError(DriverError):
    """The instance found at the expected place is not the one the caller expected to destroy."""

    kind = "identity_mismatch"


class LibraryMissing(StartupError):
    """The vendor library cannot be loaded or initialised on this node: one sentence saying so."""


class UnknownError(DriverError):
    """The driver reported an error partkeeper does not classify; retried with backoff."""

    kind = "unknown"


@runtime_checkable
class Driver(Protocol):
    name: str

    def cards(self) -> list[Card]:
        """All cards of the node, numbered from 0. Raises ReadError."""
        ...

    def instances(self, card: int) -> list[Instance]:
        """Every partition that exists on `card`. Raises ReadError on any failed or partial read."""
        ...

    def create(self, spec: InstanceSpec) -> Instance:
        """Create a partition at exactly `spec`. Raises PlacementError, UnknownError."""
        ...

    def destroy(self, expected: Instance) -> None:
        """Destroy `expected`, only if the instance at its GI id still has its identity.

        Raises InUseError, NotFoundError (already absent), IdentityMismatchError, UnknownError.
        """
        ...

    def is_busy(self, instance: Instance) -> bool:
        """Whether processes run on the instance. Raises ReadError (also where the vendor's
        library cannot tell: then busy is unknown until a destroy says IN_USE)."""
        ...

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        """The env, device nodes and mounts a container needs for `instances` (the partitions
        one container is given). Raises PlacementError with a sentence when the vendor cannot
        serve them to one container, ReadError when a node or record it needs is missing."""
        ...
