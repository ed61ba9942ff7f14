"""The driver interface: what partkeeper needs from a partitionable accelerator.

Two implementations: `sim` (a faithful MIG model in a shared JSON state file) and `nvml`. The
interface is synchronous, because NVML is; services call it through `asyncio.to_thread`.

A spec (card, profile, start) says what a partition should be and nothing about existence; an
`Instance` is the live identity the driver reports once the hardware exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Mode = Literal["partition", "sliced"]


@dataclass(frozen=True, slots=True)
class Card:
    index: int
    uuid: str
    model: str
    mode: Mode
    memory_mib: int


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
        """Whether processes run on the instance. Raises ReadError."""
        ...
