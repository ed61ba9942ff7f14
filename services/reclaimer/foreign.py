"""Foreign instances (physical, described by no claim): which are new, which went, which may go.

Pure functions over the previous sightings and this pass's foreign instances. A foreign instance
is counted occupied and reported once; it is destroyed only under `PK_FOREIGN_POLICY=reap`, when
it has been foreign continuously for the grace period (and, checked by the shell, is idle).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from partkeeper.drivers.base import Instance

Key = tuple[int, str, int]  # card, MIG UUID, GPU-instance id


@dataclass(frozen=True, slots=True)
class Sighted:
    instance: Instance
    since: float  # wall-clock time it was first seen foreign, without interruption


@dataclass(frozen=True, slots=True)
class Diff:
    known: dict[Key, Sighted]
    found: list[Sighted]
    gone: list[Sighted]


def key(inst: Instance) -> Key:
    return (inst.card, inst.uuid, inst.gi_id)


def diff(known: Mapping[Key, Sighted], current: Iterable[Instance], now: float) -> Diff:
    """This pass's foreign instances against the last: new ones are found, missing ones gone.

    An instance that a claim now describes is simply no longer foreign: it is reported gone
    (it is not reaped, and its grace period starts over if it ever becomes foreign again).
    """
    nxt: dict[Key, Sighted] = {}
    found: list[Sighted] = []
    for inst in current:
        k = key(inst)
        if k in nxt:
            continue
        seen = known.get(k)
        if seen is None or seen.instance != inst:
            seen = Sighted(inst, now)
            found.append(seen)
        nxt[k] = seen
    gone = [s for k, s in known.items() if k not in nxt or nxt[k].since != s.since]
    return Diff(nxt, found, gone)


def reapable(
    known: Mapping[Key, Sighted], now: float, *, policy: str, grace: float
) -> list[Sighted]:
    """Foreign instances the policy allows to destroy now, oldest first (idleness not checked)."""
    if policy != "reap":
        return []
    old = [s for s in known.values() if now - s.since >= grace]
    return sorted(old, key=lambda s: (s.since, key(s.instance)))
