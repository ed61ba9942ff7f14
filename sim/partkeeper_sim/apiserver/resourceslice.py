"""What the real API server does to a ResourceSlice on every create and update, in its order:
drop the fields of disabled feature gates, validate, store quantities in canonical form.

- Feature gate `DRAPartitionableDevices` off (the default on 1.34 and 1.35): the registry
  strategy silently drops `spec.sharedCounters`, `spec.perDeviceNodeSelection` and every
  device's `consumesCounters` / `nodeName` / `nodeSelector` / `allNodes`, unless the stored
  slice already used them (k8s.io/kubernetes pkg/registry/resource/resourceslice/strategy.go,
  `dropDisabledDRAPartitionableDevicesFields`). The write succeeds; only the answer shows it.
- Validation (pkg/apis/resource/validation/validation.go, `validateResourceSliceSpec`,
  `validateDevice`, `validateCounterSet`, `validateDeviceCounterConsumption`; the limits are
  the constants of pkg/apis/resource/types.go for v1 on 1.35 and 1.36):
  at most one of `devices` and `sharedCounters`; at most 128 devices
  (`ResourceSliceMaxDevices`), 64 when any device consumes counters or has taints
  (`ResourceSliceMaxDevicesWithTaintsOrConsumesCounters`); at most 8 counter sets
  (`ResourceSliceMaxCounterSets`) of at most 32 counters (`ResourceSliceMaxCountersPerCounterSet`);
  per device at most 2 counter consumptions (`ResourceSliceMaxDeviceCounterConsumptionsPerDevice`)
  of at most 32 counters (`ResourceSliceMaxCountersPerDeviceCounterConsumption`) and at most 32
  attributes and capacities together (`ResourceSliceMaxAttributesAndCapacitiesPerDevice`);
  the slice's name and the driver's are DNS subdomains (the driver's at most 63 characters);
  device, counter-set and counter names are DNS labels; attribute and capacity names are
  qualified names (an optional DNS-subdomain domain, `/`, a C identifier of at most 32 chars);
  the pool needs a name, `resourceSliceCount` > 0 and `generation` >= 0.
- Quantities: k8s.io/apimachinery pkg/api/resource stores the canonical form, so the answer
  spells `10240Mi` as `10Gi` (`partkeeper.dra.quantity`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from partkeeper.dra import quantity

from .errors import Invalid

MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS = 64
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_IDENTIFIER = 32

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NODE_FIELDS = ("nodeName", "nodeSelector", "allNodes")


def drop_disabled(obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Remove the `DRAPartitionableDevices` fields, as the strategy does with the gate off."""
    if old is not None and _uses_partitionable(old.get("spec") or {}):
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec.pop("sharedCounters", None)
    spec.pop("perDeviceNodeSelection", None)
    for device in spec.get("devices") or []:
        if isinstance(device, dict):
            device.pop("consumesCounters", None)
            for key in _NODE_FIELDS:
                device.pop(key, None)


def _uses_partitionable(spec: dict[str, Any]) -> bool:
    if spec.get("sharedCounters") or spec.get("perDeviceNodeSelection") is not None:
        return True
    return any(isinstance(d, dict) and (d.get("consumesCounters") or any(
        d.get(k) is not None for k in _NODE_FIELDS)) for d in spec.get("devices") or [])


def _dns_label(name: Any) -> bool:
    return isinstance(name, str) and len(name) <= 63 and bool(_DNS_LABEL.match(name))


def _qualified(name: Any) -> bool:
    if not isinstance(name, str):
        return False
    domain, _, identifier = name.rpartition("/")
    if domain and (len(domain) > 63 or not _DNS_SUBDOMAIN.match(domain)):
        return False
    return len(identifier) <= MAX_IDENTIFIER and bool(_C_IDENTIFIER.match(identifier))


def validate(obj: dict[str, Any]) -> None:
    """Raise Invalid, naming the first field at fault, for a slice the real server refuses."""
    spec = obj.get("spec")
    name = str((obj.get("metadata") or {}).get("name", ""))
    where = f'ResourceSlice.resource.k8s.io "{name}" is invalid'
    if not isinstance(spec, dict):
        raise Invalid(f"{where}: spec: Required value")

    def fail(path: str, why: str) -> None:
        raise Invalid(f"{where}: {path}: {why}")

    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        fail("metadata.name", f"Invalid value: {name!r}: a DNS subdomain is required")
    driver = spec.get("driver")
    if not driver:
        fail("spec.driver", "Required value")
    if not isinstance(driver, str) or len(driver) > 63 or not _DNS_SUBDOMAIN.match(driver):
        fail("spec.driver", f"Invalid value: {driver!r}: a DNS subdomain of at most 63 "
             "characters is required")
    pool = spec.get("pool")
    if not isinstance(pool, dict) or not pool.get("name"):
        fail("spec.pool.name", "Required value")
        return
    count, generation = pool.get("resourceSliceCount"), pool.get("generation", 0)
    if not isinstance(count, int) or count <= 0:
        fail("spec.pool.resourceSliceCount", f"Invalid value: {count!r}: must be greater than "
             "zero")
    if not isinstance(generation, int) or generation < 0:
        fail("spec.pool.generation", f"Invalid value: {generation!r}: must be greater than or "
             "equal to zero")
    devices, counter_sets = spec.get("devices"), spec.get("sharedCounters")
    if devices is not None and counter_sets is not None:
        fail("spec", "Invalid value: \"\": only one of `sharedCounters` or `devices` is allowed")
    devices, counter_sets = devices or [], counter_sets or []
    consuming = any(d.get("consumesCounters") or d.get("taints") for d in devices
                    if isinstance(d, dict))
    limit = MAX_DEVICES_WITH_COUNTERS if consuming else MAX_DEVICES
    if len(devices) > limit:
        fail("spec.devices", f"Too many: {len(devices)}: must have at most {limit} items")
    if len(counter_sets) > MAX_COUNTER_SETS:
        fail("spec.sharedCounters", f"Too many: {len(counter_sets)}: must have at most "
             f"{MAX_COUNTER_SETS} items")
    _unique(devices, "name", "spec.devices", fail)
    _unique(counter_sets, "name", "spec.sharedCounters", fail)
    for i, counter_set in enumerate(counter_sets):
        path = f"spec.sharedCounters[{i}]"
        _counters(counter_set, "name", MAX_COUNTERS_PER_SET, path, fail)
    for i, device in enumerate(devices):
        _device(device, f"spec.devices[{i}]", fail)


Fail = Callable[[str, str], None]


def _unique(items: list[Any], key: str, path: str, fail: Fail) -> None:
    seen: set[str] = set()
    for i, item in enumerate(items):
        value = item.get(key) if isinstance(item, dict) else None
        if value in seen:
            fail(f"{path}[{i}].{key}", f"Duplicate value: {value!r}")
        seen.add(str(value))


def _counters(entry: Any, key: str, limit: int, path: str, fail: Fail) -> None:
    if not isinstance(entry, dict) or not _dns_label(entry.get(key)):
        fail(f"{path}.{key}", "Invalid value: must be a DNS label")
        return
    counters = entry.get("counters")
    if not isinstance(counters, dict) or not counters:
        fail(f"{path}.counters", "Required value")
        return
    if len(counters) > limit:
        fail(f"{path}.counters", f"Too many: {len(counters)}: must have at most {limit} items")
    for counter, value in counters.items():
        if not _dns_label(counter):
            fail(f"{path}.counters[{counter}]", "Invalid value: must be a DNS label")
        _quantity(value, f"{path}.counters[{counter}].value", fail)


def _quantity(value: Any, path: str, fail: Fail) -> None:
    try:
        quantity.parse((value or {}).get("value") if isinstance(value, dict) else None)
    except ValueError as exc:
        fail(path, f"Invalid value: {exc}")


def _device(device: Any, path: str, fail: Fail) -> None:
    if not isinstance(device, dict) or not _dns_label(device.get("name")):
        fail(f"{path}.name", "Invalid value: must be a DNS label")
        return
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        fail(path, f"Invalid value: {len(attributes) + len(capacity)}: the total number of "
             f"attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}")
    for kind, entries in (("attributes", attributes), ("capacity", capacity)):
        for key in entries:
            if not _qualified(key):
                fail(f"{path}.{kind}[{key}]", "Invalid value: must be a qualified name "
                     "(an optional DNS subdomain, '/', a C identifier of at most 32 characters)")
    for key, value in capacity.items():
        _quantity(value, f"{path}.capacity[{key}].value", fail)
    for i, taint in enumerate(device.get("taints") or []):
        # k8s.io/kubernetes pkg/apis/resource/validation: a qualified key and a known effect.
        if not isinstance(taint, dict) or not _qualified(taint.get("key")):
            fail(f"{path}.taints[{i}].key", "Invalid value: must be a qualified name")
        elif taint.get("effect") not in TAINT_EFFECTS:
            fail(f"{path}.taints[{i}].effect", f"Unsupported value: {taint.get('effect')!r}: "
                 f"supported values: {', '.join(TAINT_EFFECTS)}")
    consumptions = device.get("consumesCounters") or []
    if len(consumptions) > MAX_CONSUMPTIONS_PER_DEVICE:
        fail(f"{path}.consumesCounters", f"Too many: {len(consumptions)}: must have at most "
             f"{MAX_CONSUMPTIONS_PER_DEVICE} items")
    _unique(consumptions, "counterSet", f"{path}.consumesCounters", fail)
    for i, use in enumerate(consumptions):
        _counters(use, "counterSet", MAX_COUNTERS_PER_CONSUMPTION,
                  f"{path}.consumesCounters[{i}]", fail)


TAINT_EFFECTS = ("NoExecute", "NoSchedule")


def canonicalise(obj: dict[str, Any]) -> None:
    """Every quantity of the slice in the canonical form the server stores (after `validate`);
    a device taint without `timeAdded` gets the time of the write, as the real server's
    strategy stamps it."""
    spec = obj.get("spec") or {}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for device in spec.get("devices") or []:
        for taint in device.get("taints") or []:
            taint.setdefault("timeAdded", stamp)
    for counter_set in spec.get("sharedCounters") or []:
        _canonical_values(counter_set.get("counters") or {})
    for device in spec.get("devices") or []:
        _canonical_values(device.get("capacity") or {})
        for use in device.get("consumesCounters") or []:
            _canonical_values(use.get("counters") or {})


def _canonical_values(entries: dict[str, Any]) -> None:
    for value in entries.values():
        if isinstance(value, dict) and "value" in value:
            value["value"] = quantity.canonical(value["value"])


def admit(obj: dict[str, Any], old: dict[str, Any] | None, *, partitionable: bool) -> None:
    """The whole write path of one ResourceSlice create (old None) or update, in place."""
    if not partitionable:
        drop_disabled(obj, old)
    validate(obj)
    canonicalise(obj)
