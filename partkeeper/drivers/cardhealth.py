"""What a card's error report means for partkeeper: a pure classification of driver events.

A driver reports `CardEvent`s (NVML: `nvmlEventSetWait_v2` on an event set registered for
critical XIDs and ECC errors; a card that answers `NVML_ERROR_GPU_IS_LOST`; the simulator:
`partkeeper sim fail --card N --xid X`). `classify` turns one into a `Fault`: the whole card
failed, one partition failed, or nothing to act on.

The rule follows NVIDIA's device plugin (k8s-device-plugin, internal/rm/health.go), so an
operator who knows its switches knows ours:

- Only critical XIDs, uncorrectable (double-bit) ECC errors and a lost card fail anything.
  Correctable (single-bit) ECC errors are reported and counted, nothing more.
- The XIDs an application causes (13, 31, 43, 45, 68, 109) are ignored; an operator adds to the
  list (`PK_HEALTH_IGNORE_XIDS=48,63` or `all`) and takes items off it (`PK_HEALTH_ENABLE_XIDS`,
  which wins), as `DP_DISABLE_HEALTHCHECKS` / `DP_ENABLE_HEALTHCHECKS` do.
- On a MIG card, an XID that NVML attributes to one GPU instance and compute instance fails that
  partition only; otherwise (ids 0xFFFFFFFF) it fails the card.

Nothing here destroys, releases or reclassifies anything: a fault only stops new placements on
what failed and tells the Pods on it (docs/operations.md, "A failed card").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

# NVML's "not attributable to an instance" id (nvml.h, nvmlEventData_t.gpuInstanceId).
NO_INSTANCE = 0xFFFFFFFF

# Application errors: the card is still healthy (k8s-device-plugin's hard-coded list).
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

# What the XIDs an operator is most likely to meet mean, for Events and logs (NVIDIA's XID
# catalogue, docs.nvidia.com/deploy/xid-errors). Others are named by number only.
MEANINGS: dict[int, str] = {
    13: "graphics engine exception (an application error)",
    31: "GPU memory page fault (an application error)",
    43: "GPU stopped processing (an application error)",
    45: "preemptive cleanup after earlier errors",
    48: "double-bit ECC error: uncorrectable memory error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception (an application error)",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: the affected application was stopped",
    95: "uncontained ECC error: every application on the card was stopped",
    109: "context switch timeout (an application error)",
    119: "GSP RPC timeout: the GPU's system processor stopped answering",
    120: "GSP error: the GPU's system processor failed",
}


class EventKind(StrEnum):
    XID = "xid"  # a critical XID (nvmlEventTypeXidCriticalError)
    ECC_UNCORRECTABLE = "ecc-uncorrectable"  # nvmlEventTypeDoubleBitEccError
    ECC_CORRECTABLE = "ecc-correctable"  # nvmlEventTypeSingleBitEccError
    LOST = "lost"  # the card answers NVML_ERROR_GPU_IS_LOST
    RECOVERED = "recovered"  # the card answers again after a reset (or `sim recover`)


@dataclass(frozen=True)
class CardEvent:
    """One report of the driver about card `card` (its index on the node)."""

    card: int
    kind: EventKind
    xid: int = 0  # for XID events; 999 is NVML's "unknown XID"
    gi: int = NO_INSTANCE  # GPU instance id, when NVML attributes the event to one
    ci: int = NO_INSTANCE  # compute instance id, likewise
    detail: str = ""  # what the driver said, verbatim, for logs and Events

    @property
    def instance(self) -> tuple[int, int] | None:
        """(GI, CI) when the event names one partition, else None."""
        if self.gi == NO_INSTANCE or self.ci == NO_INSTANCE:
            return None
        return self.gi, self.ci


class Scope(StrEnum):
    NONE = "none"  # nothing failed: the event is logged and counted
    CARD = "card"  # the whole card stops taking partitions
    INSTANCE = "instance"  # one partition failed; the card keeps serving
    RECOVERED = "recovered"  # the card may be offered again


@dataclass(frozen=True)
class Fault:
    """What one event means: `scope` says what failed, `cause` is the metric label
    (`xid-79`, `ecc`, `lost`), `meaning` the sentence an Event carries, `xid` the XID the
    event carried (0: none), which a lost card's cause does not name."""

    card: int
    scope: Scope
    cause: str
    meaning: str
    instance: tuple[int, int] | None = None
    xid: int = 0


@dataclass(frozen=True)
class XidPolicy:
    """Which XIDs fail nothing: the application XIDs, plus what the operator ignores, minus what
    the operator enables; `ignore_all` turns XID checks off except the enabled ones."""

    ignored: frozenset[int] = APPLICATION_XIDS
    enabled: frozenset[int] = frozenset()
    ignore_all: bool = False

    def ignores(self, xid: int) -> bool:
        if xid in self.enabled:
            return False
        return self.ignore_all or xid in self.ignored


def parse_xids(text: str, setting: str) -> tuple[frozenset[int], bool]:
    """`"48, 63"` -> ({48, 63}, False); `"all"` -> ((), True). Raises ValueError naming
    `setting` for anything else, so a typo stops the service at start instead of silently
    watching less."""
    xids: set[int] = set()
    for item in text.split(","):
        word = item.strip().lower()
        if not word:
            continue
        if word == "all":
            return frozenset(), True
        if not word.isdigit():
            raise ValueError(f"{setting}: {item.strip()!r} is not an XID number or 'all'")
        xids.add(int(word))
    return frozenset(xids), False


def policy(ignore: str = "", enable: str = "") -> XidPolicy:
    """The policy from `PK_HEALTH_IGNORE_XIDS` and `PK_HEALTH_ENABLE_XIDS`."""
    extra, ignore_all = parse_xids(ignore, "PK_HEALTH_IGNORE_XIDS")
    enabled, _ = parse_xids(enable, "PK_HEALTH_ENABLE_XIDS")
    return XidPolicy(APPLICATION_XIDS | extra, enabled, ignore_all)


def meaning(xid: int) -> str:
    return MEANINGS.get(xid, "see NVIDIA's XID catalogue")


def classify(event: CardEvent, rules: XidPolicy) -> Fault:
    """What `event` fails. Pure; total over every event."""
    card = event.card
    if event.kind is EventKind.RECOVERED:
        return Fault(card, Scope.RECOVERED, "recovered", "the card answers again")
    if event.kind is EventKind.LOST:
        return Fault(card, Scope.CARD, "lost", "the card stopped answering (GPU is lost)",
                     xid=event.xid)
    if event.kind is EventKind.ECC_CORRECTABLE:
        return Fault(card, Scope.NONE, "ecc-correctable", "correctable (single-bit) ECC error")
    if event.kind is EventKind.ECC_UNCORRECTABLE:
        return Fault(card, Scope.CARD, "ecc", "uncorrectable (double-bit) ECC error")
    cause = f"xid-{event.xid}"
    said = f"XID {event.xid}: {meaning(event.xid)}"
    if rules.ignores(event.xid):
        return Fault(card, Scope.NONE, cause, said)
    if event.instance is not None:
        return Fault(card, Scope.INSTANCE, cause, said, event.instance, xid=event.xid)
    return Fault(card, Scope.CARD, cause, said, xid=event.xid)


@dataclass(frozen=True)
class CardHealth:
    """What is failed on a node now: whole cards (with the fault that failed them first) and
    single partitions by (card, GI, CI). A fold of `Fault`s: `apply` is pure."""

    cards: tuple[tuple[int, Fault], ...] = ()
    instances: tuple[tuple[int, int, int, Fault], ...] = ()

    def card_fault(self, card: int) -> Fault | None:
        return next((f for c, f in self.cards if c == card), None)

    def failed_cards(self) -> frozenset[int]:
        return frozenset(c for c, _ in self.cards)

    def instance_fault(self, card: int, gi: int, ci: int) -> Fault | None:
        return next(
            (f for c, g, i, f in self.instances if (c, g, i) == (card, gi, ci)), None
        )

    def apply(self, fault: Fault) -> CardHealth:
        if fault.scope is Scope.NONE:
            return self
        if fault.scope is Scope.RECOVERED:
            return CardHealth(
                tuple(x for x in self.cards if x[0] != fault.card),
                tuple(x for x in self.instances if x[0] != fault.card),
            )
        if fault.scope is Scope.CARD:
            if self.card_fault(fault.card) is not None:
                return self  # the first cause stays: it is the one the Pods were told
            return CardHealth((*self.cards, (fault.card, fault)), self.instances)
        assert fault.instance is not None
        gi, ci = fault.instance
        if self.instance_fault(fault.card, gi, ci) is not None:
            return self
        return CardHealth(self.cards, (*self.instances, (fault.card, gi, ci, fault)))

    def fold(self, faults: Iterable[Fault]) -> CardHealth:
        state = self
        for fault in faults:
            state = state.apply(fault)
        return state


class EventSource(Protocol):
    """A driver's stream of card events. `wait` blocks (call it from a worker thread) for at most
    `timeout_s` and returns what arrived, possibly nothing; it raises only for a source that can
    no longer be read (the caller then reopens it with backoff)."""

    def wait(self, timeout_s: float) -> list[CardEvent]: ...

    def close(self) -> None: ...
