"""The simulated cards' health: `partkeeper sim fail --card N --xid X [--instance UUID]`,
`partkeeper sim recover --card N`, and the event source the services read them from.

It models what NVML reports (partkeeper/drivers/nvidia/events.py): a critical XID names its card
and, when `--instance` is given, the GPU and compute instance of that partition; XID 79 ("fallen
off the bus") also makes the card lost, as a real card that stops answering. A recovery (a reset)
is an event of its own here, where NVML's reader notices that a lost card answers again.

The source reads the state file the controls write. It polls (every POLL_SECONDS, from the worker
thread the caller runs `wait` in): the file is replaced atomically on every change and has no
notification of its own, and a card failing is rare enough that the poll costs nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from partkeeper.drivers.base import ReadError
from partkeeper.drivers.cardhealth import NO_INSTANCE, CardEvent, EventKind
from partkeeper_sim.driver_state import MAX_CARD_REPORTS, CardReport, SimState

POLL_SECONDS = 0.02
LOST_XID = 79  # NVIDIA's "GPU has fallen off the bus"


def report(state: SimState, card: int, xid: int, instance: str | None) -> CardReport:
    """Append one XID on `card` (on the partition with MIG UUID `instance`, if given) to
    `state`. Raises ValueError, changing nothing, for a card or instance that is not there."""
    if not 0 <= card < len(state.cards):
        raise ValueError(f"there is no card {card} (the node has {len(state.cards)})")
    if xid < 0:
        raise ValueError(f"XID {xid} is not an XID number")
    gi = ci = -1
    if instance is not None:
        found = [i for i in state.cards[card].instances if i.uuid == instance]
        if not found:
            raise ValueError(f"card {card} has no partition {instance}")
        gi, ci = found[0].gi_id, found[0].ci_id
    seq = (state.reports[-1].seq if state.reports else 0) + 1
    entry = CardReport(seq, card, "xid", xid, gi, ci)
    state.reports = [*state.reports, entry][-MAX_CARD_REPORTS:]
    if xid == LOST_XID and instance is None and card not in state.lost:
        state.lost = sorted([*state.lost, card])
    return entry


def recover(state: SimState, card: int) -> CardReport:
    """The card was reset: it answers again and reports itself recovered. A lost card comes
    back without its partitions, as a real one does (a GPU reset or reboot clears its GPU and
    compute instances; the MIG mode stays): the reclaimer removed their claims while the card
    was lost, and nothing is left on it to look foreign. A card that failed but kept answering
    keeps its partitions: their claims still stand."""
    if not 0 <= card < len(state.cards):
        raise ValueError(f"there is no card {card} (the node has {len(state.cards)})")
    if card in state.lost:
        state.cards[card].instances = []
    seq = (state.reports[-1].seq if state.reports else 0) + 1
    entry = CardReport(seq, card, "recovered")
    state.reports = [*state.reports, entry][-MAX_CARD_REPORTS:]
    state.lost = [c for c in state.lost if c != card]
    return entry


def as_event(entry: CardReport) -> CardEvent:
    if entry.kind == "recovered":
        return CardEvent(entry.card, EventKind.RECOVERED, detail="sim: the card was reset")
    if entry.xid == LOST_XID and entry.gi_id < 0:
        said = f"sim: XID {entry.xid}, the card fell off the bus"
        return CardEvent(entry.card, EventKind.LOST, entry.xid, detail=said)
    gi = entry.gi_id if entry.gi_id >= 0 else NO_INSTANCE
    ci = entry.ci_id if entry.ci_id >= 0 else NO_INSTANCE
    return CardEvent(entry.card, EventKind.XID, entry.xid, gi, ci, f"sim: XID {entry.xid}")


class SimEvents:
    """Card events from the state file, from those reported after it was opened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        reports = self._read().reports
        self._cursor = reports[-1].seq if reports else 0

    def _read(self) -> SimState:
        try:
            return msgspec.json.decode(self.path.read_bytes(), type=SimState)
        except (OSError, msgspec.DecodeError) as exc:
            raise ReadError("events", None, None, f"reading {self.path}: {exc}") from exc

    def wait(self, timeout_s: float) -> list[CardEvent]:
        deadline = time.monotonic() + timeout_s
        while True:
            fresh = [r for r in self._read().reports if r.seq > self._cursor]
            if fresh:
                self._cursor = fresh[-1].seq
                return [as_event(r) for r in fresh]
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            time.sleep(min(POLL_SECONDS, left))

    def close(self) -> None:
        return None
