"""Recording the host's boot in the claims documents, at a service's start: the shell of
`machine.after_boot` (docs/operations.md, "After a reboot").

The allocator and the reclaimer both run it before anything else reads the claims, so whichever
starts first after a reboot marks the claims, and the other finds them marked (the same pure
mutation, each write a compare-and-set: running it twice changes nothing). A boot id that cannot
be read leaves every document as it is: an unreadable file is not a new boot (invariant 9), and
the services then act as they did before boot ids were recorded.

NVIDIA's DRA driver keeps the boot id in its checkpoint for the same purpose (`NodeBootID`,
NVIDIA/k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/checkpointv.go`, checked in `NewDeviceState`,
PR #1066): a legacy checkpoint without one gets the current boot and is kept, a different one
makes it start from an empty checkpoint. Claims cannot be dropped that way (they hold the device
IDs kubelet keeps for running Pods, and only the reclaimer removes one), so here they are marked.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from pathlib import Path

from partkeeper import backoff, bootid
from partkeeper.claims import machine
from partkeeper.claims.store import ClaimsStore, ConflictExhausted, StoreReadError
from partkeeper.telemetry.logs import decision
from schemas import CardClaims

log = logging.getLogger(__name__)
SCHEDULE = backoff.Schedule(0.2, 5.0)  # while the store does not answer at a start


async def settle(store: ClaimsStore, cards: Iterable[int], proc_root: Path) -> str | None:
    """Record the current boot on every card's document, marking the claims a reboot left
    without partitions. Returns the boot id, or None when it cannot be read (nothing written).
    Retried while the store does not answer (a service cannot start without its claims)."""
    try:
        boot = bootid.read(proc_root)
    except bootid.BootIdError as exc:
        log.warning("%s; a reboot cannot be told from a restart, so claims are kept as they are "
                    "(docs/operations.md, \"After a reboot\")", exc)
        return None
    for card in sorted(set(cards)):
        before, _ = await _read(store, card)
        if before.boot_id == boot:
            continue
        after, _ = await backoff.retry(
            f"recording boot {boot} on the claims of card {card}",
            functools.partial(store.update, card,
                              functools.partial(machine.after_boot, boot_id=boot)),
            transient=_unanswered, schedule=SCHEDULE)
        marked = sorted(c for c, claim in after.claims.items()
                        if claim.rebooted and not before.claims.get(c, claim).rebooted)
        if before.boot_id and marked:
            decision(log, f"the host rebooted (boot {before.boot_id} -> {boot}): the partitions "
                     f"of {len(marked)} claims are gone; kept for their Pods, re-made when "
                     "kubelet asks again, released when their Pods end", card=card,
                     claim_id=",".join(marked))
        elif before.boot_id:
            decision(log, f"the host rebooted (boot {before.boot_id} -> {boot}); no partition "
                     "claim was on the card", card=card)
    return boot


def _unanswered(exc: Exception) -> bool:
    return isinstance(exc, (StoreReadError, ConflictExhausted))


async def _read(store: ClaimsStore, card: int) -> tuple[CardClaims, int]:
    return await backoff.retry(f"reading the claims of card {card}",
                               functools.partial(store.read, card), transient=_unanswered,
                               schedule=SCHEDULE)
