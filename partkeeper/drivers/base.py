"""The driver interface: what partkeeper needs from a partitionable accelerator.

Four implementations, named by `PK_DRIVER`: `nvml`, `hgml` and `dmi` are the one MIG algorithm
(mig.py) over NVIDIA's, T-Head's and Hygon's libraries; `sim` is a faithful MIG model in a shared
JSON state file. The interface is synchronous, because the libraries are; services call it
through `asyncio.to_thread`.

A spec (card, profile, start) says what a partition should be and nothing about existence; an
`Instance` is the live identity the driver reports once the hardware exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from partkeeper.devices import DeviceNode
from partkeeper.drivers.cardhealth import EventSource
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


IdentityRule = Callable[[Instance, Instance], bool]
"""`rule(recorded, listed)`: whether `listed`, as an enumeration reports it now, is the partition
that was recorded as `recorded` when it was created. Each driver states its vendor's rule as its
`same_partition` method; nothing outside the drivers compares identities itself."""


def _where(inst: Instance) -> tuple[int, int, str, int]:
    return (inst.card, inst.gi_id, inst.profile, inst.start)


def _left_at_slot(recorded: Instance, listed: Instance) -> bool:
    """`listed` is a GPU instance without compute instance exactly where `recorded` was: what a
    destroy stopped between its two steps leaves. It has no identity of its own, so only where it
    sits can say whose it was (a claim still holds that slot, so nothing else was made there)."""
    return not listed.complete and _where(listed) == _where(recorded)


def slot_identity(recorded: Instance, listed: Instance) -> bool:
    """NVIDIA's and T-Head's rule: the MIG device UUID is derived from the slot, so a successor
    at the same GI id reproduces it; the partition is the same UUID at the same GI id, profile and
    start (or the GPU instance an interrupted destroy left at its slot)."""
    if listed.complete:
        return listed.uuid == recorded.uuid and _where(listed) == _where(recorded)
    return _left_at_slot(recorded, listed)


def issued_identity(recorded: Instance, listed: Instance) -> bool:
    """Hygon's rule: the library issues a fresh UUID on every create, even at the same placement,
    so the UUID names one partition's lifetime and a successor never matches its predecessor; the
    GI id is not part of it (the next create may take it). The profile and start must agree too
    (or the GPU instance an interrupted destroy left at its slot)."""
    if listed.complete:
        shape = (listed.card, listed.profile, listed.start)
        return listed.uuid == recorded.uuid and shape == (
            recorded.card, recorded.profile, recorded.start
        )
    return _left_at_slot(recorded, listed)


def identity_mismatch(expected: Instance, found: Instance) -> IdentityMismatchError:
    """The refusal of a destroy whose expected partition is no longer what sits at its GI id."""
    now = found.uuid or "no compute instance"
    cause = f"GPU instance {found.gi_id} is {found.profile} at start {found.start} with {now}"
    return IdentityMismatchError(
        "destroy", expected.card, expected.uuid or f"GI {expected.gi_id}", cause
    )


@dataclass(frozen=True, slots=True)
class HostMount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """What a container needs to use its partitions (or whole cards, for logical slices), as the
    vendor's runtime expects it.

    The Allocate reply (and a partition's CDI spec, where that mode is on) carries exactly this."""

    env: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[DeviceNode, ...] = ()
    mounts: tuple[HostMount, ...] = ()


NVIDIA_VISIBLE = "NVIDIA_VISIBLE_DEVICES"


def nvidia_edits(instances: Sequence[Instance]) -> ContainerEdits:
    """NVIDIA's (and the sim's): the container runtime hook takes the MIG UUIDs from the env."""
    return ContainerEdits(env={NVIDIA_VISIBLE: ",".join(i.uuid for i in instances)})


def nvidia_card_edits(cards: Sequence[Card]) -> ContainerEdits:
    """The same for whole cards: the hook takes the cards' UUIDs."""
    return ContainerEdits(env={NVIDIA_VISIBLE: ",".join(c.uuid for c in cards)})


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


class ModeOffError(NotFoundError):
    """The card's partition mode was switched off under the services: no instance can exist on
    it, so the one sought is gone (a destroy meeting this is done)."""

    kind = "mode_off"


class ReadError(DriverError):
    """An enumeration failed or was partial. Never to be taken as 'absent' (fail closed)."""

    kind = "read_failed"


class CardLostError(ReadError):
    """The card stopped answering (NVML_ERROR_GPU_IS_LOST: fallen off the bus): every call on it
    fails until it is reset. A read error, so absence means nothing, and the reclaimer can tell a
    lost card from a failed call (docs/drivers.md, "Card health")."""

    kind = "card_lost"


def lost_card(index: int, exc: CardLostError) -> Card:
    """How an enumeration lists a card that stopped answering: still there (its index holds
    claims and partitions the reclaimer must resolve), in partition mode so that it is asked, and
    with a problem, so that nothing is offered on it. What it was cannot be read any more."""
    return Card(index, "", "", "partition", 0, None, f"lost: {exc.cause}")


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

    def same_partition(self, recorded: Instance, listed: Instance) -> bool:
        """The vendor's identity rule (`IdentityRule`): whether `listed` is the partition this
        driver reported as `recorded`. Pure: no call to the library."""
        ...

    def destroy(self, expected: Instance) -> None:
        """Destroy `expected`, only if the instance at its GI id is it (`same_partition`).

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

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        """The env, device nodes and mounts a container needs to use `cards` whole (the cards its
        logical slices sit on), in that order, each shared node once. The card's mode does not
        matter. Raises ReadError when a node or record it needs is missing or is another card's."""
        ...

    def leftovers(self) -> list[str]:
        """Host records that block creates and that the reclaimer may remove (Hygon's squatted
        registry records); empty for a driver that can have none. Raises DriverError."""
        ...

    def remove_leftover(self, record: str) -> None:
        """Remove one record `leftovers` reported. Raises OSError, or ValueError for a record
        that is no leftover of this driver."""
        ...

    def events(self) -> EventSource | None:
        """A new source of card events (partkeeper/drivers/cardhealth.py), or None for a driver
        with no event source. Raises ReadError when the library refuses to open one."""
        ...
