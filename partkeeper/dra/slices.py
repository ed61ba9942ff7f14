"""The node's ResourceSlices as a pure function of a snapshot (docs/contract.md section 11).

One pool per node, named after the node, holding:

- counter slices: per partition-mode card one counter set `gpu-<card>` with `memory-slice-0` ..
  `memory-slice-<n-1>` (value 1 each; n the card model's memory slices, the extent of its
  placements: 8 on NVIDIA and T-Head, 4 on a Hygon DCU) and `compute-slices` (the card's compute
  capacity), at most eight sets per slice and no devices beside them (the API allows only one of
  the two);
- device slices: one device per (profile, placement) that is free now, smallest profile first,
  each consuming its placement's memory slices and its compute slices from its card's set, at
  most 64 per slice (the API's limit for devices that consume counters).

A placement covered by a claim in any state or by any physical instance (foreign ones included)
is not offered at all: the scheduler never sees room the hardware lacks. The free devices of a
failed card (a fatal XID, or lost: DESIGN.md, "Card health") carry the taint
`partitions.partkeeper.io/unhealthy` with effect `NoSchedule` (its value the cause, `xid-48`,
`lost`) on a server that takes device taints (`resource.k8s.io/v1`, stable in 1.37), so an
operator sees them and the scheduler places nothing there; on an older server they are
withdrawn. Every slice of the pool carries the same generation and `resourceSliceCount`;
`generation` bumps it whenever the content changes, so a consumer never mixes slices of two
generations.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from partkeeper.dra import DRIVER, quantity
from partkeeper.dra.devices import DeviceSpec, all_devices, compute_capacity, memory_slices
from partkeeper.drivers import Card, Instance
from partkeeper.drivers.profiles import overlaps
from schemas import Claim

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 64  # devices that consume counters
MAX_COUNTER_SETS_PER_SLICE = 8
COMPUTE_COUNTER = "compute-slices"
MAX_NAME = 253
TAINT_KEY = f"{DRIVER}/unhealthy"
TAINT_EFFECT = "NoSchedule"

Range = tuple[int, int]


def memory_counter(index: int) -> str:
    return f"memory-slice-{index}"


def counter_set_name(card: int) -> str:
    return f"gpu-{card}"


def attribute(name: str) -> str:
    """An attribute or capacity name qualified by the driver's domain."""
    return f"{DRIVER}/{name}"


@dataclass(frozen=True, slots=True)
class Pool:
    """What the node's pool should hold, without generation or slice names."""

    node: str
    counter_sets: tuple[dict[str, Any], ...]
    devices: tuple[dict[str, Any], ...]
    owner: dict[str, Any] | None = None  # the Node, as controller owner of every slice

    def chunks(self) -> list[tuple[str, str, list[dict[str, Any]]]]:
        """(kind, spec key, items) per slice: counter slices first, then device slices."""
        sets = _split(self.counter_sets, MAX_COUNTER_SETS_PER_SLICE)
        devices = _split(self.devices, MAX_DEVICES_PER_SLICE)
        return [("counters", "sharedCounters", c) for c in sets] + [
            ("devices", "devices", d) for d in devices
        ]


def _split(items: Sequence[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def occupied(claims: Iterable[Claim], instances: Iterable[Instance]) -> dict[int, list[Range]]:
    """Per card, every range a partition claim (any state) or a physical instance covers; a
    claim whose partition a reboot removed covers nothing until it is re-made."""
    taken: dict[int, list[Range]] = {}
    for claim in claims:
        if claim.kind == "partition" and not claim.rebooted:
            taken.setdefault(claim.card, []).append((claim.start, claim.size))
    for inst in instances:
        taken.setdefault(inst.card, []).append(inst.placement)
    return taken


def free_devices(
    cards: Sequence[Card], claims: Iterable[Claim], instances: Iterable[Instance]
) -> list[DeviceSpec]:
    """Devices whose placement nothing covers, in publishing order."""
    taken = occupied(claims, instances)
    return [
        d for d in all_devices(cards)
        if not any(overlaps(d.range, t) for t in taken.get(d.card, ()))
    ]


def counter_set(card: Card) -> dict[str, Any]:
    counters = {memory_counter(i): {"value": "1"} for i in range(memory_slices(card.model))}
    counters[COMPUTE_COUNTER] = {"value": str(compute_capacity(card.model))}
    return {"name": counter_set_name(card.index), "counters": counters}


def device(spec: DeviceSpec) -> dict[str, Any]:
    covered = range(spec.start, spec.start + spec.size)
    consumed = {memory_counter(s): {"value": "1"} for s in covered}
    consumed[COMPUTE_COUNTER] = {"value": str(spec.profile.compute_slices)}
    return {
        "name": spec.name,
        "attributes": {
            attribute("profile"): {"string": spec.profile.name},
            attribute("card"): {"int": spec.card},
            attribute("start"): {"int": spec.start},
            attribute("size"): {"int": spec.size},
            attribute("model"): {"string": spec.model},
        },
        # Sent in the server's canonical spelling (10240Mi is stored as 10Gi), so what is read
        # back reads the same; `content` compares values, not spellings, in any case.
        "capacity": {attribute("memory"): {
            "value": quantity.canonical(f"{spec.profile.memory_mib}Mi")}},
        "consumesCounters": [{"counterSet": counter_set_name(spec.card), "counters": consumed}],
    }


def taint(cause: str) -> dict[str, Any]:
    """The taint a failed card's devices carry; the value is the cause, a label value."""
    return {"key": TAINT_KEY, "value": cause[:63], "effect": TAINT_EFFECT}


def pool(
    node: str, cards: Sequence[Card], claims: Iterable[Claim], instances: Iterable[Instance],
    owner: dict[str, Any] | None = None, *, failed: Mapping[int, str] | None = None,
    taints: bool = False,
) -> Pool:
    """The pool; `failed`: card -> cause of the cards that take nothing new, whose free devices
    are tainted (`taints`: the server takes device taints) or else withdrawn."""
    failed = failed or {}
    partition_cards = sorted((c for c in cards if c.mode == "partition"), key=lambda c: c.index)
    devices = []
    for spec in free_devices(partition_cards, claims, instances):
        body = device(spec)
        if spec.card in failed:
            if not taints:
                continue
            body["taints"] = [taint(failed[spec.card])]
        devices.append(body)
    return Pool(
        node=node,
        counter_sets=tuple(counter_set(c) for c in partition_cards),
        devices=tuple(devices),
        owner=owner,
    )


def slice_prefix(node: str) -> str:
    """The common start of this node's slice names, kept within the API's name length."""
    base = f"{node}-partkeeper"
    if len(base) <= MAX_NAME - 20:
        return base
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[: MAX_NAME - 40]}-{digest}"


def slices(desired: Pool, generation: int) -> list[dict[str, Any]]:
    """The ResourceSlice objects of the pool at `generation`, named deterministically."""
    chunks = desired.chunks()
    prefix = slice_prefix(desired.node)
    out = []
    for i, (kind, key, items) in enumerate(chunks):
        spec = {
            "driver": DRIVER,
            "nodeName": desired.node,
            "pool": {"name": desired.node, "generation": generation,
                     "resourceSliceCount": len(chunks)},
            key: items,
        }
        metadata: dict[str, Any] = {"name": f"{prefix}-{kind}-{i:03d}"}
        if desired.owner is not None:
            metadata["ownerReferences"] = [dict(desired.owner)]
        out.append({"apiVersion": API_VERSION, "kind": "ResourceSlice",
                    "metadata": metadata, "spec": spec})
    return out


_OWNER_KEYS = ("apiVersion", "kind", "name", "uid", "controller")


def content(objects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What a set of published slices says, generation left out: name -> spec without pool,
    plus the owners. Quantities are compared by value: the server answers in canonical form."""
    found = {}
    for obj in objects:
        spec = copy.deepcopy(dict(obj.get("spec") or {}))
        spec.pop("pool", None)
        for counter_set in spec.get("sharedCounters") or []:
            _values(counter_set.get("counters"))
        for dev in spec.get("devices") or []:
            _values(dev.get("capacity"))
            for said_taint in dev.get("taints") or []:
                said_taint.pop("timeAdded", None)  # the server stamps it: not ours to compare
            for use in dev.get("consumesCounters") or []:
                _values(use.get("counters"))
        said = {k: v for k, v in spec.items() if v not in (None, [], {})}
        metadata = obj.get("metadata") or {}
        said["owners"] = [{k: o.get(k) for k in _OWNER_KEYS}
                          for o in metadata.get("ownerReferences") or []]
        found[str(metadata.get("name"))] = said
    return found


def _values(entries: Any) -> None:
    """Quantities in place as exact numbers (an unreadable one stays as it is: it differs)."""
    for value in (entries or {}).values():
        if isinstance(value, dict) and "value" in value:
            with contextlib.suppress(ValueError):
                value["value"] = quantity.parse(value["value"])


def generation(current: Sequence[Mapping[str, Any]], desired: Pool) -> int:
    """The generation to publish `desired` at, given the slices published now.

    Unchanged content (and a complete pool at one generation) keeps the generation; anything else
    takes one above the highest seen, so consumers drop every older slice.
    """
    gens = {int(s.get("spec", {}).get("pool", {}).get("generation", 0)) for s in current}
    highest = max(gens, default=0)
    if len(gens) == 1 and content(current) == content(slices(desired, highest)):
        counts = {s.get("spec", {}).get("pool", {}).get("resourceSliceCount") for s in current}
        if counts == {len(current)}:
            return highest
    return highest + 1
