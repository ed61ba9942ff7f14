"""The simulated driver's state file: its schema, validation, atomic writes and lock.

One JSON document shared by every process that uses the simulated cards; see sim.py for how
operations use it.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from partkeeper.drivers import cardhealth, profiles

FaultOp = Literal["create", "destroy", "list"]
FaultKind = Literal["in_use", "unknown", "halfway"]
LatencyOp = Literal["create", "destroy"]

STATE_VERSION = 1
LOCK_TIMEOUT_SECONDS = 30.0
FAULT_OPS: tuple[FaultOp, ...] = ("create", "destroy", "list")
FAULT_ERRORS: tuple[FaultKind, ...] = ("in_use", "unknown", "halfway")
# `halfway`: the operation stops between its two steps and fails (UnknownError), leaving a GPU
# instance without compute instance: a create after the GPU instance (and the undo failed too),
# a destroy after the compute instance. Only create and destroy have two steps.
HALFWAY_OPS: tuple[FaultOp, ...] = ("create", "destroy")
LATENCY_OPS: tuple[LatencyOp, ...] = ("create", "destroy")
# Fixed so that identities are reproducible across processes and re-initialisations.
_NAMESPACE = uuid.UUID("6f1c3a52-5d0e-4c47-9a7e-2b8f4e1d9c30")

_Count = Annotated[int, msgspec.Meta(ge=0)]


class SimInstance(msgspec.Struct, forbid_unknown_fields=True):
    gi_id: int
    ci_id: int
    uuid: str
    profile: str
    start: int
    size: int
    busy: bool = False
    state: Literal["ready", "destroying"] = "ready"
    carved: bool = False  # made by hand (`sim carve`), i.e. foreign to the agent


class SimCard(msgspec.Struct, forbid_unknown_fields=True):
    index: int
    uuid: str
    model: str
    mode: Literal["partition", "sliced"]
    instances: list[SimInstance] = msgspec.field(default_factory=list)


class Fault(msgspec.Struct, forbid_unknown_fields=True):
    times: _Count
    error: FaultKind = "unknown"


class CardReport(msgspec.Struct, forbid_unknown_fields=True):
    """One card event, as NVML's event set would deliver it (`partkeeper sim fail --card`,
    `sim recover`); `seq` orders them for every reader of the file."""

    seq: int
    card: int
    kind: Literal["xid", "recovered"]
    xid: int = 0
    gi_id: int = -1  # the GPU and compute instance an XID names, -1 for the whole card
    ci_id: int = -1


# How many card events the state file keeps: a reader further behind misses the oldest.
MAX_CARD_REPORTS = 64


class SimState(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    cards: list[SimCard]
    faults: dict[FaultOp, Fault] = msgspec.field(default_factory=dict)
    latency_ms: dict[LatencyOp, _Count] = msgspec.field(default_factory=dict)
    # Fields added after version 1 with defaults, so an older state file reads unchanged.
    reports: list[CardReport] = msgspec.field(default_factory=list)
    lost: list[int] = msgspec.field(default_factory=list)  # cards fallen off the bus (XID 79)


def card_uuid(seed: str, index: int, model: str) -> str:
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{seed}/card/{index}/{model}')}"


def mig_uuid(card: str, gi_id: int, ci_id: int, profile: str, start: int) -> str:
    """Name-based on purpose: a successor at the same slot and GI id gets the same UUID."""
    return f"MIG-{uuid.uuid5(_NAMESPACE, f'{card}/{gi_id}/{ci_id}/{profile}/{start}')}"


def instance_uuid(card: SimCard, gi_id: int, ci_id: int, profile: str, start: int) -> str:
    """The identity the card's vendor gives a new partition.

    NVIDIA and T-Head derive it from the slot (`mig_uuid`: a successor reproduces it); Hygon issues
    a fresh one on every create, even at the same placement, as measured on a DCU.
    """
    if profiles.model(card.model).vendor == "hygon":
        return f"MIG-{uuid.uuid4()}"
    return mig_uuid(card.uuid, gi_id, ci_id, profile, start)


def encode_state(state: SimState) -> bytes:
    return msgspec.json.format(msgspec.json.encode(state), indent=2) + b"\n"


def check_state(state: SimState) -> None:
    """Semantic checks msgspec's schema cannot express. Raises ValueError naming the problem."""
    if state.version != STATE_VERSION:
        raise ValueError(f"version {state.version} is not the supported {STATE_VERSION}")
    for position, card in enumerate(state.cards):
        if card.index != position:
            raise ValueError(f"card at position {position} has index {card.index}")
        model = profiles.model(card.model)
        if card.mode == "sliced" and card.instances:
            raise ValueError(f"sliced card {position} holds partitions")
        taken: list[SimInstance] = []
        for inst in card.instances:
            if (inst.ci_id < 0) != (not inst.uuid):
                raise ValueError(f"instance GI {inst.gi_id} on card {position} has a UUID only "
                                 "with a compute instance (ci_id -1 and uuid \"\" go together)")
            profile = model.profiles.get(inst.profile)
            if profile is None or inst.start not in profile.starts or inst.size != profile.size:
                raise ValueError(f"instance {inst.uuid} on card {position} has an illegal shape")
            for other in taken:
                if other.gi_id == inst.gi_id or profiles.overlaps(
                    (inst.start, inst.size), (other.start, other.size)
                ):
                    raise ValueError(f"instances {other.uuid} and {inst.uuid} collide")
            taken.append(inst)


def write_state(path: Path, state: SimState) -> None:
    """Atomic: readers see the old or the new file, never a torn one.

    Not fsynced: the simulated cards, like MIG instances (gone at a reboot), need not survive a
    power loss, and a sync per create and destroy cost 1-4 ms of each (docs/benchmarks.md)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes 0600; keep the file readable by the other processes sharing it.
        os.fchmod(fd, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(encode_state(state))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# A transaction holds the lock for a fraction of a millisecond, so a waiter retries at that pace:
# the sim's latencies are what the reclaim and DRA benchmarks measure, and a coarser
# poll (filelock's default is 50 ms) would be measured instead.
LOCK_POLL_SECONDS = 0.001


class LockTimeout(Exception):
    """The state file's lock stayed held for LOCK_TIMEOUT_SECONDS."""


class StateLock:
    """The state file's lock: flock(2) on `<state>.lock`, the lock every process and thread
    sharing the simulated cards takes around a transaction.

    Each lock opens its own file description, so threads of one process exclude each other as
    processes do (flock locks belong to the open file description, flock(2)); read-only is
    enough for flock, so any user who can read the lock file can take it. Uncontended this is
    three system calls: the filelock package took 30 times as long (143 against 4.4 us on the
    benchmark machine), on every create, destroy and enumeration."""

    def __init__(self, path: Path, timeout: float = LOCK_TIMEOUT_SECONDS) -> None:
        self.path = Path(f"{path}.lock")
        self.timeout = timeout
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises LockTimeout, or OSError when the lock file cannot be opened."""
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(LOCK_POLL_SECONDS)
                    continue
                os.close(fd)
                raise LockTimeout(f"{self.path} stayed locked for {self.timeout:g} s") from None
            except BaseException:
                os.close(fd)
                raise

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)  # also for a child forked meanwhile
            finally:
                os.close(fd)

    def __enter__(self) -> StateLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def init_state(
    path: str | os.PathLike[str],
    cards: list[str],
    sliced: list[str],
    *,
    force: bool = False,
    seed: str = "",
) -> dict[str, Any]:
    """Create the state file: `cards` in partition mode first, then `sliced`, numbered from 0.

    Refuses (FileExistsError) to replace an existing file unless `force`. `seed` varies the card
    UUIDs, e.g. to simulate several nodes; the default keeps them reproducible.
    """
    target = Path(path)
    names = [*cards, *sliced]
    if not names:
        raise ValueError("at least one card is needed")
    for name in names:
        profiles.model(name)  # UnknownModelError (a ValueError) names the known models
    state = SimState(
        version=STATE_VERSION,
        cards=[
            SimCard(i, card_uuid(seed, i, name), name, "partition" if i < len(cards) else "sliced")
            for i, name in enumerate(names)
        ],
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    with StateLock(target):
        if target.exists() and not force:
            raise FileExistsError(f"the state file {target} already exists")
        write_state(target, state)
    return snapshot(state)


def reboot(state: SimState) -> dict[str, Any]:
    """A host reboot, on the state: every card's instances are gone (busy ones too: a reboot ends
    their processes); mode, UUIDs, health reports, lost cards and faults stay. Returns what each
    card lost, by card index: the UUIDs."""
    lost: dict[str, Any] = {}
    for card in state.cards:
        lost[str(card.index)] = sorted(i.uuid for i in card.instances)
        card.instances = []
    return {"removed": lost}


def snapshot(state: SimState) -> dict[str, Any]:
    """The `sim list --json` shape (docs/contract.md section 6): the state plus `memory_mib`,
    and each card's `health` and fatal `xids` since its last recovery."""
    view: dict[str, Any] = msgspec.to_builtins(state)
    for card in view["cards"]:
        card["memory_mib"] = profiles.model(card["model"]).memory_mib
        card["instances"].sort(key=lambda i: i["start"])
        card["health"], card["xids"] = card_health(state, card["index"])
    return view


def card_health(state: SimState, card: int) -> tuple[str, list[int]]:
    """("ok" | "failed" | "lost", the fatal XIDs reported since the card's last recovery), by
    the rule the services apply (partkeeper/drivers/cardhealth.py, default switches)."""
    mine = [r for r in state.reports if r.card == card]
    last = max((i + 1 for i, r in enumerate(mine) if r.kind == "recovered"), default=0)
    rules = cardhealth.policy()
    fatal: list[int] = []
    failed = False
    for r in mine[last:]:
        gi = r.gi_id if r.gi_id >= 0 else cardhealth.NO_INSTANCE
        ci = r.ci_id if r.ci_id >= 0 else cardhealth.NO_INSTANCE
        event = cardhealth.CardEvent(card, cardhealth.EventKind.XID, r.xid, gi, ci)
        scope = cardhealth.classify(event, rules).scope
        if scope is not cardhealth.Scope.NONE:
            fatal.append(r.xid)
        failed = failed or scope is cardhealth.Scope.CARD
    if card in state.lost:
        return "lost", fatal
    return ("failed" if failed else "ok"), fatal
