"""The `resource.k8s.io/v1` kinds of Dynamic Resource Allocation: ResourceSlices, DeviceClasses,
ResourceClaims (with status) and ResourceClaimTemplates.

Everything DRA adds to the server lives here: the kinds with their create-time checks, the fields
a selector may name, the discovery documents and the routes. The store and the HTTP layer stay
generic. Checks are the ones a driver or scheduler bug would trip: a slice must hold devices or
counter sets, not both, and within the API's limits; a claim's requests must name a class.
"""

from __future__ import annotations

from typing import Any

from .errors import Invalid

GROUP = "resource.k8s.io"
API_VERSION = f"{GROUP}/v1"
PREFIX = f"/apis/{API_VERSION}"

MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS = 64
MAX_COUNTER_SETS = 8

# plural -> (kind, namespaced, has status)
RESOURCES: dict[str, tuple[str, bool, bool]] = {
    "resourceslices": ("ResourceSlice", False, False),
    "deviceclasses": ("DeviceClass", False, False),
    "resourceclaims": ("ResourceClaim", True, True),
    "resourceclaimtemplates": ("ResourceClaimTemplate", True, False),
}

FIELDS: dict[str, frozenset[str]] = {
    "resourceslices": frozenset(
        {"metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"}
    ),
    "deviceclasses": frozenset({"metadata.name"}),
    "resourceclaims": frozenset({"metadata.name", "metadata.namespace"}),
    "resourceclaimtemplates": frozenset({"metadata.name", "metadata.namespace"}),
}


def _name(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _spec(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise Invalid(f'{kind} "{_name(obj)}" is invalid: spec: Required value')
    return spec


def prepare_slice(obj: dict[str, Any]) -> None:
    spec = _spec("ResourceSlice", obj)
    where = f'ResourceSlice "{_name(obj)}" is invalid'
    if not spec.get("driver"):
        raise Invalid(f"{where}: spec.driver: Required value")
    pool = spec.get("pool")
    if not isinstance(pool, dict) or not pool.get("name"):
        raise Invalid(f"{where}: spec.pool.name: Required value")
    if not isinstance(pool.get("generation"), int) or pool.get("resourceSliceCount", 0) < 1:
        raise Invalid(f"{where}: spec.pool: generation and resourceSliceCount > 0 are required")
    devices, counters = spec.get("devices") or [], spec.get("sharedCounters") or []
    if devices and counters:
        raise Invalid(f"{where}: spec: only one of devices and sharedCounters may be set")
    limit = MAX_DEVICES
    if any(d.get("consumesCounters") or d.get("taints") for d in devices):
        limit = MAX_DEVICES_WITH_COUNTERS
    if len(devices) > limit:
        raise Invalid(f"{where}: spec.devices: Too many: {len(devices)}: must have at most "
                      f"{limit} items")
    if len(counters) > MAX_COUNTER_SETS:
        raise Invalid(f"{where}: spec.sharedCounters: Too many: {len(counters)}: must have at "
                      f"most {MAX_COUNTER_SETS} items")
    names = [d.get("name") for d in devices]
    if len(set(names)) != len(names) or not all(names):
        raise Invalid(f"{where}: spec.devices: device names must be set and unique")


def prepare_class(obj: dict[str, Any]) -> None:
    obj.setdefault("spec", {})
    _spec("DeviceClass", obj)


def _check_claim_spec(kind: str, name: str, spec: Any) -> None:
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    if not isinstance(requests, list) or not requests:
        raise Invalid(f'{kind} "{name}" is invalid: spec.devices.requests: Required value')
    for request in requests:
        exactly = request.get("exactly") if isinstance(request, dict) else None
        if not request.get("name") or not isinstance(exactly, dict) or \
                not exactly.get("deviceClassName"):
            raise Invalid(f'{kind} "{name}" is invalid: spec.devices.requests: each needs a '
                          "name and exactly.deviceClassName")
        exactly.setdefault("allocationMode", "ExactCount")
        exactly.setdefault("count", 1)


def prepare_claim(obj: dict[str, Any]) -> None:
    _check_claim_spec("ResourceClaim", _name(obj), _spec("ResourceClaim", obj))
    obj.setdefault("status", {})


def prepare_template(obj: dict[str, Any]) -> None:
    template = _spec("ResourceClaimTemplate", obj)
    _check_claim_spec("ResourceClaimTemplate", _name(obj), template.get("spec"))


PREPARE = {
    "resourceslices": prepare_slice,
    "deviceclasses": prepare_class,
    "resourceclaims": prepare_claim,
    "resourceclaimtemplates": prepare_template,
}

_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def group() -> dict[str, Any]:
    version = {"groupVersion": API_VERSION, "version": "v1"}
    return {"name": GROUP, "versions": [version], "preferredVersion": version}


def api_resources() -> dict[str, Any]:
    listed = []
    for plural, (kind, namespaced, status) in RESOURCES.items():
        listed.append({"name": plural, "singularName": "", "namespaced": namespaced,
                       "kind": kind, "verbs": _VERBS})
        if status:
            listed.append({"name": f"{plural}/status", "singularName": "",
                           "namespaced": namespaced, "kind": kind,
                           "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "groupVersion": API_VERSION, "resources": listed}
