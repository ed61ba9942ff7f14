"""The structured allocator's decision, pure: which devices a set of claims gets, or none.

As the real scheduler's allocator does: only complete pools count (the highest generation, with
as many slices as `resourceSliceCount` says); a device already allocated to any claim is taken;
every allocated device's `consumesCounters` is subtracted from its pool's counter sets; the
remaining requests are served first fit, in slice order (slices by name, devices as listed). Either
every request of every claim is served or nothing is allocated. A device with a taint the request
does not tolerate is never a candidate (k8s.io/dynamic-resource-allocation structured allocator,
`allTaintsTolerated`; tolerations matched as resourceclaim.ToleratesTaint does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from partkeeper.dra.quantity import parse as quantity
from partkeeper_sim.scheduler import cel

PoolKey = tuple[str, str]  # (driver, pool)
CounterKey = tuple[str, str, str, str]  # (driver, pool, counter set, counter)


@dataclass(frozen=True, slots=True)
class Candidate:
    driver: str
    pool: str
    device: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.device.get("name", ""))

    def consumption(self) -> dict[CounterKey, Fraction]:
        used: dict[CounterKey, Fraction] = {}
        for use in self.device.get("consumesCounters") or []:
            for counter, value in (use.get("counters") or {}).items():
                key = (self.driver, self.pool, use.get("counterSet", ""), counter)
                used[key] = used.get(key, 0) + quantity(value.get("value", 0))
        return used


@dataclass
class Inventory:
    """The complete pools: devices in slice order and the counters they share."""

    devices: list[Candidate] = field(default_factory=list)
    counters: dict[CounterKey, Fraction] = field(default_factory=dict)

    def find(self, driver: str, pool: str, name: str) -> Candidate | None:
        return next((d for d in self.devices
                     if (d.driver, d.pool, d.name) == (driver, pool, name)), None)


def complete_pools(slices: Iterable[Mapping[str, Any]]) -> Inventory:
    by_pool: dict[PoolKey, list[Mapping[str, Any]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        key = (str(spec.get("driver")), str((spec.get("pool") or {}).get("name")))
        by_pool.setdefault(key, []).append(s)
    inventory = Inventory()
    for (driver, pool), members in sorted(by_pool.items()):
        top = max(int(m["spec"]["pool"]["generation"]) for m in members)
        current = sorted((m for m in members if int(m["spec"]["pool"]["generation"]) == top),
                         key=lambda m: str(m["metadata"]["name"]))
        if len(current) != int(current[0]["spec"]["pool"].get("resourceSliceCount", 0)):
            continue  # incomplete: a consumer must not use it
        for member in current:
            spec = member["spec"]
            for counter_set in spec.get("sharedCounters") or []:
                for counter, value in (counter_set.get("counters") or {}).items():
                    counter_key = (driver, pool, counter_set["name"], counter)
                    inventory.counters[counter_key] = quantity(value.get("value", 0))
            inventory.devices.extend(Candidate(driver, pool, d) for d in spec.get("devices") or [])
    return inventory


def results_of(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def left(inventory: Inventory, allocated: Iterable[Mapping[str, Any]]
         ) -> tuple[dict[CounterKey, Fraction], set[tuple[str, str, str]]]:
    """Counters left and devices taken after every allocated claim's devices."""
    counters = dict(inventory.counters)
    taken: set[tuple[str, str, str]] = set()
    for claim in allocated:
        for result in results_of(claim):
            key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
            taken.add(key)
            device = inventory.find(*key)
            if device is None:
                continue  # withdrawn by its driver: its consumption went with it
            for counter, used in device.consumption().items():
                counters[counter] = counters.get(counter, 0) - used
    return counters, taken


class Unsatisfiable(Exception):
    """Some request cannot be served now; the message says which."""


def _selectors(spec: Mapping[str, Any]) -> list[str]:
    return [s["cel"]["expression"] for s in spec.get("selectors") or [] if s.get("cel")]


def allocate(
    inventory: Inventory,
    classes: Mapping[str, Mapping[str, Any]],
    allocated: Iterable[Mapping[str, Any]],
    wanted: Sequence[Mapping[str, Any]],
) -> dict[str, list[dict[str, str]]]:
    """Results per claim name for every request of `wanted`. Raises Unsatisfiable, or
    cel.SelectorError for a selector outside the supported subset.

    A request with `firstAvailable` (prioritized list, beta and on by default since 1.34) is
    served by its first subrequest that fits now, and its results name `<request>/<subrequest>`
    (k8s.io/dynamic-resource-allocation structured allocator; the real one also backtracks
    across requests, which first fit over these pools never needs)."""
    counters, taken = left(inventory, allocated)
    out: dict[str, list[dict[str, str]]] = {}
    for claim in wanted:
        name = claim["metadata"]["name"]
        out[name] = []
        for request in claim["spec"]["devices"]["requests"]:
            options = [(request["name"], request["exactly"])] if request.get("exactly") else [
                (f"{request['name']}/{sub['name']}", sub) for sub in request["firstAvailable"]]
            served = next(((n, c) for n, spec in options
                           if (c := _serve(inventory, classes, counters, taken, spec))), None)
            if served is None:
                raise Unsatisfiable(f"claim {name} request {request['name']}: no device fits "
                                    "now")
            result_name, chosen = served
            for device in chosen:
                for counter, used in device.consumption().items():
                    counters[counter] -= used
                taken.add((device.driver, device.pool, device.name))
                out[name].append({"request": result_name, "driver": device.driver,
                                  "pool": device.pool, "device": device.name})
    return out


def _serve(inventory: Inventory, classes: Mapping[str, Mapping[str, Any]],
           counters: dict[CounterKey, Fraction], taken: set[tuple[str, str, str]],
           spec: Mapping[str, Any]) -> list[Candidate] | None:
    """The devices one (sub)request gets, first fit, or None; `counters` and `taken` are left
    as they were."""
    device_class = classes.get(spec["deviceClassName"])
    if device_class is None:
        raise Unsatisfiable(f"DeviceClass {spec['deviceClassName']} does not exist")
    expressions = _selectors(device_class.get("spec") or {}) + _selectors(spec)
    counters, taken = dict(counters), set(taken)
    chosen: list[Candidate] = []
    tolerations = list(spec.get("tolerations") or [])
    for _ in range(int(spec.get("count", 1))):
        device = _first_fit(inventory, counters, taken, expressions, tolerations)
        if device is None:
            return None
        for counter, used in device.consumption().items():
            counters[counter] -= used
        taken.add((device.driver, device.pool, device.name))
        chosen.append(device)
    return chosen


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether one toleration of a request tolerates one device taint: an empty key with
    `Exists` tolerates every taint, an empty effect every effect; `Equal` (the default) also
    wants the same value."""
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def tolerated(device: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Every taint of the device tolerated by some toleration of the request."""
    return all(any(tolerates(t, taint) for t in tolerations)
               for taint in device.get("taints") or [])


def _first_fit(inventory: Inventory, counters: dict[CounterKey, Fraction],
               taken: set[tuple[str, str, str]], expressions: list[str],
               tolerations: Sequence[Mapping[str, Any]] = ()) -> Candidate | None:
    for device in inventory.devices:
        if (device.driver, device.pool, device.name) in taken:
            continue
        if not tolerated(device.device, tolerations):
            continue
        if not all(cel.matches(e, device.device, device.driver) for e in expressions):
            continue
        if all(counters.get(k, 0) >= v for k, v in device.consumption().items()):
            return device
    return None
