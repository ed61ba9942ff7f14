"""The `sim` driver: a faithful MIG model whose "hardware" is one JSON file under a file lock.

Separate processes (allocator, reclaimer, tests, `partkeeper sim`) share one set of cards by sharing
the file. Every operation is one transaction: lock, read, validate, mutate, write atomically
(temp file + os.replace), unlock. A missing or corrupt file is a ReadError naming the file; it is
never recreated behind the caller's back, because an empty "hardware" would read as "no partitions"
and that is exactly the fail-open read partkeeper exists to avoid.

Faithfulness that matters to the design: GPU-instance ids are the lowest free (from 1), and MIG
device UUIDs are name-based (uuid5 of card uuid, GI id, CI id, profile, start), so a successor at
the same slot reproduces its predecessor's identity, as measured on real hardware.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from partkeeper.drivers import mig, profiles
from partkeeper.drivers.base import (
    Card,
    CardLostError,
    ContainerEdits,
    DriverError,
    IdentityMismatchError,
    IdentityRule,
    Instance,
    InstanceSpec,
    InUseError,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
    identity_mismatch,
    issued_identity,
    lost_card,
    nvidia_card_edits,
    nvidia_edits,
    slot_identity,
)
from partkeeper.drivers.vendor import one_partition
from partkeeper_sim import driver_health
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
    instance_uuid,
    mig_uuid,
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

def _lowest_free_gi(card: SimCard) -> int:
    used = {inst.gi_id for inst in card.instances}
    return next(gi_id for gi_id in itertools.count(1) if gi_id not in used)


def identity_rule(model: str) -> IdentityRule:
    """The identity rule of the vendor of a card of `model`, as its real driver states it."""
    return issued_identity if profiles.model(model).vendor == "hygon" else slot_identity


def _to_instance(card: SimCard, inst: SimInstance) -> Instance:
    return Instance(
        card.index, inst.profile, inst.start, inst.size, inst.gi_id, inst.ci_id, inst.uuid
    )


class _Slow(Exception):
    """The operation was given a latency (`sim latency`): sleep `seconds`, then do it."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


class SimDriver:
    """The Driver protocol over a shared state file, plus the controls `partkeeper sim` uses."""

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
        mutate: Callable[[SimState], T],
        fault: FaultOp | None = None,
        where: _Where = (None, None),
        halfway: Callable[[SimState], object] | None = None,
        latency: LatencyOp | None = None,
    ) -> T:
        """The one writer: `mutate` raises before it changes anything, or returns. `halfway` is
        the first of the operation's two steps, taken when a `halfway` fault is armed. With
        `latency`, an operation given one raises _Slow before anything else: the caller sleeps
        outside the lock and comes back; one given none needs no second transaction."""
        with self._locked(op):
            state = self._read(op)
            if where[0] is not None and where[0] in state.lost:
                # As NVML answers for a card fallen off the bus (NVML_ERROR_GPU_IS_LOST).
                raise CardLostError(op, where[0], where[1], "GPU is lost")
            if latency is not None and (ms := state.latency_ms.get(latency, 0)):
                raise _Slow(ms / 1000.0)
            taken = _take_fault(state, fault, op, where) if fault is not None else None
            if taken is not None:
                error, kind = taken
                try:
                    if kind == "halfway" and halfway is not None:
                        halfway(state)  # may refuse as the whole operation would (nothing made)
                finally:
                    write_state(self.path, state)  # the countdown persists though the op fails
                raise error
            before = encode_state(state)
            result = mutate(state)
            if encode_state(state) != before:
                write_state(self.path, state)
            return result

    # -- the Driver protocol ------------------------------------------------------------------

    def cards(self) -> list[Card]:
        def read(state: SimState) -> list[Card]:
            self._remember(state)
            return [
                lost_card(c.index, CardLostError("list", c.index, None, "GPU is lost"))
                if c.index in state.lost
                else Card(c.index, c.uuid, c.model, c.mode, profiles.model(c.model).memory_mib)
                for c in state.cards
            ]

        return self._transact("list", read, "list")

    def instances(self, card: int) -> list[Instance]:
        def read(state: SimState) -> list[Instance]:
            self._remember(state)
            found = _card(state, card, "list", NotFoundError)
            return [_to_instance(found, i) for i in sorted(found.instances, key=lambda i: i.start)]

        return self._transact("list", read, "list", (card, None))

    def create(self, spec: InstanceSpec) -> Instance:
        place = partial(_place, spec=spec, op="create", carved=False)
        half = partial(_half_create, spec=spec)
        try:
            return self._transact("create", place, "create", (spec.card, None), half,
                                  latency="create")
        except _Slow as slow:
            # Slept outside the lock: other processes keep working, as they would on hardware.
            self._sleep(slow.seconds)
        return self._transact("create", place, "create", (spec.card, None), half)

    def destroy(self, expected: Instance) -> None:
        where = (expected.card, expected.uuid)
        delay = self._transact(
            "destroy", partial(_begin_destroy, expected=expected), "destroy", where,
            partial(_half_destroy, expected=expected),
        )
        if delay:
            # Not holding the lock: the instance stays listed (state "destroying") meanwhile.
            self._sleep(delay)
            self._transact("destroy", partial(_finish_destroy, expected=expected))

    def same_partition(self, recorded: Instance, listed: Instance) -> bool:
        """The rule of the card's vendor: NVIDIA's and T-Head's slot identity, Hygon's issued one.
        The card's model comes from the enumeration that listed `listed`, so no read is needed."""
        return identity_rule(self._model_of(listed.card, "identity"))(recorded, listed)

    def _remember(self, state: SimState) -> None:
        self._models = {c.index: c.model for c in state.cards}

    def _model_of(self, card: int, op: str) -> str:
        """The card's model as the last read found it (a card keeps its model for the life of
        the state file), read when no read has yet; NotFoundError for a card that is not there."""
        model = self._models.get(card)
        if model is None:
            model = self._transact(op, lambda s: _card(s, card, op, NotFoundError).model)
        return model

    def is_busy(self, instance: Instance) -> bool:
        return self._transact("busy", lambda s: _find(s, instance, "busy")[1].busy,
                              where=(instance.card, instance.uuid))

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        """Each vendor's rules without its device nodes (the sim has none): NVIDIA's env for
        NVIDIA cards; one partition per container on T-Head and Hygon, Hygon's env variable."""

        found = {profiles.model(self._model_of(i.card, "allocate")).vendor for i in instances}
        if found <= {"nvidia"}:
            return nvidia_edits(instances)
        inst = one_partition(instances, "/".join(sorted(found - {"nvidia"})))
        env = {"DMI_MIG_VISIBLE_DEVICE": inst.uuid} if "hygon" in found else {}
        return ContainerEdits(env=env)

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        """Each vendor's rule for whole cards without device nodes: the card UUIDs in NVIDIA's
        env for NVIDIA cards; nothing for T-Head and Hygon cards, whose hand-off is nodes only."""

        found = [profiles.model(self._model_of(c.index, "allocate")).vendor for c in cards]
        shown = [c for c, v in zip(cards, found, strict=True) if v == "nvidia"]
        return nvidia_card_edits(shown) if shown else ContainerEdits()

    def leftovers(self) -> list[str]:
        """The simulated cards leave no host records behind."""
        return []

    def remove_leftover(self, record: str) -> None:
        raise ValueError(f"{record} is no leftover of the sim driver")

    # -- controls (`partkeeper sim ...` and tests) --------------------------------------------

    def carve(self, card: int, profile: str, start: int | None = None) -> Instance:
        """Make an instance by hand, outside the agent (foreign); default the lowest free start."""

        def mutate(state: SimState) -> Instance:
            chosen = start if start is not None else _lowest_free_start(state, card, profile)
            return _place(state, InstanceSpec(card, profile, chosen), "carve", True)

        return self._transact("carve", mutate)

    def set_busy(self, instance_uuid: str, on: bool) -> Instance:
        """A process starts (on) or stops (off) holding the instance with that MIG UUID."""

        def mutate(state: SimState) -> Instance:
            for card in state.cards:
                for inst in card.instances:
                    if instance_uuid and inst.uuid == instance_uuid:
                        inst.busy = on
                        return _to_instance(card, inst)
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

        def mutate(state: SimState) -> dict[str, Any]:
            state.faults[op] = Fault(times, error)
            return {"op": op, "times": times, "error": error}

        return self._transact("fail", mutate)

    def fail_card(self, card: int, xid: int, instance: str | None = None) -> dict[str, Any]:
        """Card `card` reports XID `xid` (on the partition `instance`, if given)."""

        def mutate(state: SimState) -> dict[str, Any]:
            return msgspec.to_builtins(driver_health.report(state, card, xid, instance))

        return self._transact("fail", mutate)

    def recover_card(self, card: int) -> dict[str, Any]:
        """Card `card` was reset and answers again."""

        def mutate(state: SimState) -> dict[str, Any]:
            return msgspec.to_builtins(driver_health.recover(state, card))

        return self._transact("recover", mutate)

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

        def mutate(state: SimState) -> dict[str, Any]:
            state.latency_ms[op] = ms
            return {"op": op, "ms": ms}

        return self._transact("latency", mutate)

    def list(self) -> dict[str, Any]:
        """Everything, shaped like `partkeeper sim list --json`. Never consumes injected faults."""
        return self._transact("list", snapshot)


# -- pure transaction bodies (each raises before it mutates) ------------------------------------


def _take_fault(
    state: SimState, op: FaultOp, label: str, where: _Where
) -> tuple[DriverError, FaultKind] | None:
    fault = state.faults.get(op)
    if fault is None or fault.times <= 0:
        return None
    fault.times -= 1
    cause = f"injected {fault.error} failure ({fault.times} more to come)"
    if fault.error == "halfway":
        left = "its GPU instance was made, its compute instance was not, and undoing it failed too"
        if op == "destroy":
            left = "its compute instance was destroyed, its GPU instance was not"
        cause = f"{cause}: {left}"
    kind = ReadError if op == "list" else InUseError if fault.error == "in_use" else UnknownError
    return kind(label, *where, cause), fault.error


def _card(state: SimState, index: int, op: str, error: type[DriverError]) -> SimCard:
    if not 0 <= index < len(state.cards):
        raise error(op, index, None, f"no such card; the node has {len(state.cards)}")
    return state.cards[index]


def _offered(card: SimCard, profile: str, op: str) -> profiles.Profile:
    if card.mode != "partition":
        raise PlacementError(op, card.index, None, "the card is in sliced mode, not partition")
    offered = profiles.model(card.model).profiles
    if profile not in offered:
        names = ", ".join(offered)
        cause = f"{card.model} has no profile {profile!r}; it offers {names}"
        raise PlacementError(op, card.index, None, cause)
    return offered[profile]


def _collision(card: SimCard, start: int, size: int) -> SimInstance | None:
    return next(
        (i for i in card.instances if profiles.overlaps((start, size), (i.start, i.size))), None
    )


def _lowest_free_start(state: SimState, index: int, profile: str) -> int:
    card = _card(state, index, "carve", PlacementError)
    offered = _offered(card, profile, "carve")
    for start in offered.starts:
        if _collision(card, start, offered.size) is None:
            return start
    raise PlacementError("carve", index, None, f"no free placement for {profile} is left")


def _place(state: SimState, spec: InstanceSpec, op: str, carved: bool) -> Instance:
    card = _card(state, spec.card, op, PlacementError)
    profile = _offered(card, spec.profile, op)
    if spec.start not in profile.starts:
        legal = ", ".join(map(str, profile.starts))
        cause = f"start {spec.start} is not a legal placement of {spec.profile} (legal: {legal})"
        raise PlacementError(op, card.index, None, cause)
    existing = [_to_instance(card, i) for i in card.instances]
    left = mig.leftover_at(spec, existing) if op == "create" else None
    if left is not None:
        # What a create stopped halfway left: the retried create makes its compute instance,
        # as the one MIG algorithm completes such a GPU instance rather than refuse the slot.
        other = next(i for i in card.instances if i.gi_id == left.gi_id)
        other.ci_id = 0
        other.uuid = instance_uuid(card, other.gi_id, 0, spec.profile, spec.start)
        return _to_instance(card, other)
    mig.refuse_overlap(spec, profile.size, existing, op)
    gi_id = _lowest_free_gi(card)
    uuid_ = instance_uuid(card, gi_id, 0, spec.profile, spec.start)
    inst = SimInstance(gi_id, 0, uuid_, spec.profile, spec.start, profile.size, carved=carved)
    card.instances.append(inst)
    return _to_instance(card, inst)


def _half_create(state: SimState, spec: InstanceSpec) -> None:
    made = _place(state, spec, "create", carved=False)
    inst = next(i for i in state.cards[spec.card].instances if i.gi_id == made.gi_id)
    inst.ci_id, inst.uuid = -1, ""


def _half_destroy(state: SimState, expected: Instance) -> None:
    card, inst = _find(state, expected, "destroy")
    if inst.busy:
        raise InUseError("destroy", card.index, inst.uuid, "processes are running on the instance")
    inst.ci_id, inst.uuid = -1, ""


def _find(state: SimState, expected: Instance, op: str) -> tuple[SimCard, SimInstance]:
    card = _card(state, expected.card, op, NotFoundError)
    for inst in card.instances:
        if inst.gi_id != expected.gi_id:
            continue
        found = _to_instance(card, inst)
        if not identity_rule(card.model)(expected, found):
            mismatch = identity_mismatch(expected, found)
            raise IdentityMismatchError(op, card.index, mismatch.instance, mismatch.cause)
        return card, inst
    raise NotFoundError(op, card.index, expected.uuid, f"no GPU instance {expected.gi_id} exists")


def _begin_destroy(state: SimState, expected: Instance) -> float:
    card, inst = _find(state, expected, "destroy")
    if inst.busy:
        raise InUseError("destroy", card.index, inst.uuid, "processes are running on the instance")
    delay = state.latency_ms.get("destroy", 0) / 1000.0
    if delay:
        inst.state = "destroying"
    else:
        card.instances.remove(inst)
    return delay


def _finish_destroy(state: SimState, expected: Instance) -> None:
    card, inst = _find(state, expected, "destroy")
    card.instances.remove(inst)
