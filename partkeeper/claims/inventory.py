"""What exists against what is claimed, for one card: a pure classification of a snapshot.

Used by the reclaimer (what to destroy, what is foreign), the allocator (capacity) and status.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from partkeeper.drivers.base import IdentityRule, Instance
from schemas import CardClaims, Claim


@dataclass(frozen=True, slots=True)
class Inventory:
    owned: dict[str, Instance] = field(default_factory=dict)  # claim id -> its recorded instance
    unrecorded: dict[str, Instance] = field(default_factory=dict)  # claim id -> one at its spec
    vanished: list[str] = field(default_factory=list)  # claims whose recorded instance is gone
    foreign: list[Instance] = field(default_factory=list)  # instances no claim describes
    rebooted: list[str] = field(default_factory=list)  # claims whose partition a reboot removed


def _at_spec(claim: Claim, inst: Instance) -> bool:
    return inst.profile == claim.profile and inst.start == claim.start


def _recorded(claim: Claim) -> Instance | None:
    if claim.instance is None:
        return None
    live = claim.instance
    return Instance(claim.card, claim.profile, claim.start, claim.size, live.gi_id, live.ci_id,
                    live.uuid)


def classify(doc: CardClaims, instances: list[Instance], same: IdentityRule) -> Inventory:
    """Match physical instances to the card's partition claims.

    A claim with a recorded identity owns the instance its driver's identity rule `same` (the
    driver's `same_partition`) says is it: for every vendor that includes the GPU instance an
    interrupted destroy left at its slot without a compute instance, so that the destroy is
    finished, never the slot lost. A claim without one (creating, or released mid-create) is
    matched to an instance exactly at its spec, which is what a create interrupted by a crash
    leaves behind. Every other instance is foreign.

    A claim marked `rebooted` owns nothing: its partition went with the boot that made it, and
    an instance at its slot now (same name-based UUID or not) is another one, foreign unless
    another claim describes it. It is not `vanished` either: nothing unexpected happened to it.
    """
    inv = Inventory()
    used: set[tuple[str, int]] = set()
    inv.rebooted.extend(c.id for c in doc.claims.values()
                        if c.kind == "partition" and c.rebooted)
    partitions = [c for c in doc.claims.values() if c.kind == "partition" and not c.rebooted]
    for claim in partitions:
        recorded = _recorded(claim)
        if recorded is None:
            continue
        found = next((i for i in instances if same(recorded, i)), None)
        if found is not None:
            inv.owned[claim.id] = found
            used.add((found.uuid, found.gi_id))
        else:
            inv.vanished.append(claim.id)
    for claim in partitions:
        if claim.instance is not None:
            continue
        for inst in instances:
            key = (inst.uuid, inst.gi_id)
            if key not in used and _at_spec(claim, inst):
                inv.unrecorded[claim.id] = inst
                used.add(key)
                break
    inv.foreign.extend(i for i in instances if (i.uuid, i.gi_id) not in used)
    return inv
