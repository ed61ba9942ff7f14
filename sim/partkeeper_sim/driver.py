"""The `sim` driver: the one MIG algorithm over simulated cards whose "hardware" is one JSON
file under a file lock.

Separate processes (allocator, reclaimer, tests, `partkeeper sim`) share one set of cards by sharing
the file. Every operation is one transaction: lock, read, validate, run the operation, write
atomically (temp file + os.replace), unlock. The operation is mig.MigDriver's, the algorithm every
real node runs, over a binding whose "library" is the state the transaction holds
(driver_binding.py). A missing or corrupt file is a ReadError naming the file; it is never
recreated behind the caller's back, because an empty "hardware" would read as "no partitions" and
that is exactly the fail-open read partkeeper exists to avoid.

Faithfulness that matters to the design: GPU-instance ids are the lowest free (from 1), and MIG
device UUIDs are name-based (uuid5 of card uuid, GI id, CI id, profile, start), so a successor at
the same slot reproduces its predecessor's identity, as measured on real hardware.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from partkeeper.drivers.base import (
    Card,
    CardLostError,
    ContainerEdits,
    DriverError,
    Instance,
    InstanceSpec,
    InUseError,
    NotFoundError,
    ReadError,
    UnknownError,
)
from partkeeper_sim import driver_health
from partkeeper_sim.driver_binding import (
    SimBinding,
    SimMig,
    card_edits,
    container_edits,
    identity_rule,
)
from partkeeper_sim.driver_state import (
    FAULT_ERRORS,
    FAULT_OPS,
    HALFWAY_OPS,
    LATENCY_OPS,
    LOCK_TIMEOUT_SECONDS,
    STATE_VERSION,
    Fault,
    FaultKind,
    FaultOp,
    LatencyOp,
    LockTimeout,
    SimCard,
    SimInstance,
    SimState,
    StateLock,
    card_health,
    card_uuid,
    check_state,
    encode_state,
    init_state,
    mig_uuid,
    reboot,
    snapshot,
    write_state,
)

__all__ = [
    "FAULT_ERRORS",
    "FAULT_OPS",
    "LATENCY_OPS",
    "LOCK_TIMEOUT_SECONDS",
    "STATE_VERSION",
    "Fault",
    "FaultKind",
    "FaultOp",
    "LatencyOp",
    "LockTimeout",
    "SimCard",
    "SimDriver",
    "SimInstance",
    "SimState",
    "StateLock",
    "card_uuid",
    "check_state",
    "encode_state",
    "init_state",
    "mig_uuid",
    "snapshot",
    "write_state",
]

T = TypeVar("T")
_Where = tuple[int | None, str | None]  # the card and instance an error names


class _Slow(Exception):
    """The operation was given a latency (`sim latency`): sleep `seconds`, then do it."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


class SimDriver:
    """The Driver protocol over a shared state file, plus the controls `partkeeper sim` uses.
    Each operation is the one MIG algorithm (mig.MigDriver) over a SimBinding of one transaction."""

    name = "sim"

    def __init__(
        self, path: str | os.PathLike[str], *, sleep: Callable[[float], None] = time.sleep,
        lock_timeout: float = LOCK_TIMEOUT_SECONDS,
    ) -> None:
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self._sleep = sleep  # injectable so tests can hold an operation inside its latency
        self._models: dict[int, str] = {}  # card index -> model, as the last read found them

    # -- transactions -------------------------------------------------------------------------

    @contextmanager
    def _locked(self, op: str) -> Iterator[None]:
        if not self.path.exists():
            # Checked before locking so that a mistyped path leaves no lock file behind.
            raise ReadError(op, None, None, self._missing())
        lock = StateLock(self.path, self.lock_timeout)
        try:
            lock.acquire()
        except LockTimeout as exc:
            cause = f"the state file {self.path} stayed locked for {self.lock_timeout:g} s"
            raise UnknownError(op, None, None, cause) from exc
        except OSError as exc:
            raise ReadError(op, None, None, f"cannot lock {self.path}: {exc.strerror}") from exc
        try:
            yield
        finally:
            lock.release()

    def _missing(self) -> str:
        return f"the state file {self.path} does not exist; create it with `partkeeper sim init`"

    def _read(self, op: str) -> SimState:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raise ReadError(op, None, None, self._missing()) from None
        except OSError as exc:
            raise ReadError(op, None, None, f"cannot read {self.path}: {exc.strerror}") from exc
        try:
            state = msgspec.json.decode(raw, type=SimState)
            check_state(state)
        except (msgspec.DecodeError, ValueError) as exc:
            cause = f"the state file {self.path} is corrupt ({exc})"
            raise ReadError(op, None, None, cause) from exc
        return state

    def _transact(
        self,
        op: str,
        act: Callable[[SimBinding], T],
        fault: FaultOp | None = None,
        where: _Where = (None, None),
        latency: LatencyOp | None = None,
        carved: bool = False,
    ) -> T:
        """The one writer: lock, read, `act` on a binding over the state, write what changed
        (also when `act` fails: what a library did before failing stays done), unlock.

        `fault` takes the operation's injected failure: an `in_use` or `unknown` one fails it
        before anything is done; a `halfway` one is armed in the binding, which fails after the
        operation's first step. With `latency`, an operation given one raises _Slow before
        anything else: the caller sleeps outside the lock and comes back; one given none needs
        no second transaction."""
        with self._locked(op):
            state = self._read(op)
            self._models = {c.index: c.model for c in state.cards}
            if where[0] is not None and where[0] in state.lost:
                # As NVML answers for a card fallen off the bus (NVML_ERROR_GPU_IS_LOST).
                raise CardLostError(op, where[0], where[1], "GPU is lost")
            if latency is not None and (ms := state.latency_ms.get(latency, 0)):
                raise _Slow(ms / 1000.0)
            before = encode_state(state)
            binding = SimBinding(state, carved=carved)
            try:
                taken = _take_fault(state, fault, op, where) if fault is not None else None
                if taken is not None:
                    error, kind = taken
                    if kind != "halfway":
                        raise error
                    binding.halfway = error
                return act(binding)
            finally:
                if encode_state(state) != before:
                    write_state(self.path, state)  # a fault's countdown persists though it fails

    # -- the Driver protocol ------------------------------------------------------------------

    def cards(self) -> list[Card]:
        return self._transact("list", lambda b: SimMig(b).cards(), "list")

    def instances(self, card: int) -> list[Instance]:
        return self._transact("list", lambda b: SimMig(b).instances(card), "list", (card, None))

    def create(self, spec: InstanceSpec) -> Instance:
        def create(b: SimBinding) -> Instance:
            return SimMig(b).create(spec)

        try:
            return self._transact("create", create, "create", (spec.card, None), latency="create")
        except _Slow as slow:
            # Slept outside the lock: other processes keep working, as they would on hardware.
            self._sleep(slow.seconds)
        return self._transact("create", create, "create", (spec.card, None))

    def destroy(self, expected: Instance) -> None:
        def destroy(b: SimBinding) -> float:
            SimMig(b).destroy(expected)
            return b.destroy_delay

        delay = self._transact("destroy", destroy, "destroy", (expected.card, expected.uuid))
        if delay:
            # Not holding the lock: the instance stays listed (state "destroying") meanwhile.
            self._sleep(delay)
            self._transact("destroy", lambda b: b.finish_destroy(expected))

    def same_partition(self, recorded: Instance, listed: Instance) -> bool:
        """The rule of the card's vendor: NVIDIA's and T-Head's slot identity, Hygon's issued one.
        The card's model comes from the enumeration that listed `listed`, so no read is needed."""
        return identity_rule(self._model_of(listed.card, "identity"))(recorded, listed)

    def _model_of(self, card: int, op: str) -> str:
        """The card's model as the last read found it (a card keeps its model for the life of
        the state file), read when no read has yet; NotFoundError for a card that is not there."""
        model = self._models.get(card)
        if model is None:
            model = self._transact(op, lambda b: b.model(card, op))
        return model

    def is_busy(self, instance: Instance) -> bool:
        return self._transact("busy", lambda b: SimMig(b).is_busy(instance),
                              where=(instance.card, instance.uuid))

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        return container_edits(instances, lambda card: self._model_of(card, "allocate"))

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        return card_edits(cards, lambda card: self._model_of(card, "allocate"))

    def leftovers(self) -> list[str]:
        """The simulated cards leave no host records behind."""
        return []

    def remove_leftover(self, record: str) -> None:
        raise ValueError(f"{record} is no leftover of the sim driver")

    # -- controls (`partkeeper sim ...` and tests) --------------------------------------------

    def carve(self, card: int, profile: str, start: int | None = None) -> Instance:
        """Make an instance by hand, outside the agent (foreign); default the lowest free start."""

        def carve(b: SimBinding) -> Instance:
            spec = b.carve_spec(card, profile, start)
            try:
                return SimMig(b).create(spec)
            except DriverError as exc:  # the hand tool's operation, not the agent's create
                raise type(exc)("carve", exc.card, exc.instance, exc.cause) from exc

        return self._transact("carve", carve, carved=True)

    def set_busy(self, instance_uuid: str, on: bool) -> Instance:
        """A process starts (on) or stops (off) holding the instance with that MIG UUID."""

        def mutate(b: SimBinding) -> Instance:
            for card in b.state.cards:
                for inst in card.instances:
                    if instance_uuid and inst.uuid == instance_uuid:
                        inst.busy = on
                        return Instance(card.index, inst.profile, inst.start, inst.size,
                                        inst.gi_id, inst.ci_id, inst.uuid)
            raise NotFoundError("busy", None, instance_uuid, "no instance has this UUID")

        return self._transact("busy", mutate)

    def fail(self, op: FaultOp, times: int, error: FaultKind = "unknown") -> dict[str, Any]:
        """The next `times` driver calls of `op` fail (list failures are ReadErrors)."""
        if op not in FAULT_OPS or error not in FAULT_ERRORS or times < 0:
            raise ValueError(
                f"cannot inject {times} {error!r} failures into {op!r}: op is one of "
                f"{', '.join(FAULT_OPS)}, error one of {', '.join(FAULT_ERRORS)}, times >= 0"
            )
        if error == "halfway" and op not in HALFWAY_OPS:
            raise ValueError(f"cannot stop {op!r} halfway: only "
                             f"{' and '.join(HALFWAY_OPS)} have two steps")

        def mutate(b: SimBinding) -> dict[str, Any]:
            b.state.faults[op] = Fault(times, error)
            return {"op": op, "times": times, "error": error}

        return self._transact("fail", mutate)

    def fail_card(self, card: int, xid: int, instance: str | None = None) -> dict[str, Any]:
        """Card `card` reports XID `xid` (on the partition `instance`, if given)."""

        def mutate(b: SimBinding) -> dict[str, Any]:
            return msgspec.to_builtins(driver_health.report(b.state, card, xid, instance))

        return self._transact("fail", mutate)

    def recover_card(self, card: int) -> dict[str, Any]:
        """Card `card` was reset and answers again."""

        def mutate(b: SimBinding) -> dict[str, Any]:
            return msgspec.to_builtins(driver_health.recover(b.state, card))

        return self._transact("recover", mutate)

    def reboot(self) -> dict[str, Any]:
        """The host rebooted: every card loses its partitions (MIG GPU and compute instances do
        not survive a reboot; NVIDIA's mig-parted re-applies a MIG layout at each boot for that
        reason, `deployments/systemd` in NVIDIA/mig-parted). MIG mode, the cards' UUIDs, their
        health and the injected faults are kept. The boot id is not the driver's: it is the file
        under `PK_PROC_ROOT`, which whoever simulates the reboot changes."""

        def mutate(b: SimBinding) -> dict[str, Any]:
            return reboot(b.state)

        return self._transact("reboot", mutate)

    def card_health(self, card: int) -> tuple[str, list[int]]:
        """("ok" | "failed" | "lost", the fatal XIDs since the last recovery), as `sim list`
        says them: `partkeeper probe` shows it for the sim's cards."""
        return card_health(self._read("list"), card)

    def events(self) -> driver_health.SimEvents:
        return driver_health.SimEvents(self.path)

    def latency(self, op: LatencyOp, ms: int) -> dict[str, Any]:
        """Every later `op` (create or destroy) takes `ms` milliseconds, until set to 0."""
        if op not in LATENCY_OPS or ms < 0:
            raise ValueError(f"cannot set latency {ms} ms on {op!r}: op is create or destroy")

        def mutate(b: SimBinding) -> dict[str, Any]:
            b.state.latency_ms[op] = ms
            return {"op": op, "ms": ms}

        return self._transact("latency", mutate)

    def list(self) -> dict[str, Any]:
        """Everything, shaped like `partkeeper sim list --json`. Never consumes injected faults."""
        return self._transact("list", lambda b: snapshot(b.state))


# -- the injected faults --------------------------------------------------------------------------


def _take_fault(
    state: SimState, op: FaultOp, label: str, where: _Where
) -> tuple[DriverError, FaultKind] | None:
    fault = state.faults.get(op)
    if fault is None or fault.times <= 0:
        return None
    fault.times -= 1
    cause = f"injected {fault.error} failure ({fault.times} more to come)"
    if fault.error == "halfway" and op == "destroy":
        # A create's halfway failure is the binding failing its compute-instance create and the
        # undo's GPU-instance destroy: the one MIG algorithm's error says what was left.
        cause = f"{cause}: its compute instance was destroyed, its GPU instance was not"
    kind = ReadError if op == "list" else InUseError if fault.error == "in_use" else UnknownError
    return kind(label, *where, cause), fault.error
