"""The `resource.k8s.io/v1` kinds of Dynamic Resource Allocation: ResourceSlices, DeviceClasses,
ResourceClaims (with status) and ResourceClaimTemplates.

Everything DRA adds to the server lives here: the kinds with their create-time checks, the fields
a selector may name, the discovery documents and the routes. The store and the HTTP layer stay
generic. Checks are the ones a driver or scheduler bug would trip: a slice is checked as the real
server checks it (`resourceslice.py`); a claim's requests must name a class.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import Invalid

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
GROUP = "resource.k8s.io"
API_VERSION = f"{GROUP}/v1"
PREFIX = f"/apis/{API_VERSION}"

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
    # Validated (and canonicalised) with the feature gates in view on every write: the store
    # calls `resourceslice.admit`, create and update alike.
    _spec("ResourceSlice", obj)


def prepare_class(obj: dict[str, Any]) -> None:
    obj.setdefault("spec", {})
    _spec("DeviceClass", obj)


def _check_claim_spec(kind: str, name: str, spec: Any) -> None:
    """Each request sets exactly one of `exactly` and `firstAvailable` (a prioritized list of
    at most 8 subrequests with DNS-label names), as pkg/apis/resource/validation checks; the
    defaults (`allocationMode: ExactCount`, `count: 1`) are filled as the v1 defaulting does."""
    where = f'{kind} "{name}" is invalid: spec.devices.requests'
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    if not isinstance(requests, list) or not requests:
        raise Invalid(f"{where}: Required value")
    for request in requests:
        if not isinstance(request, dict) or not request.get("name"):
            raise Invalid(f"{where}: each needs a name")
        exactly, first = request.get("exactly"), request.get("firstAvailable")
        if (exactly is None) == (first is None):
            raise Invalid(f"{where}[{request['name']}]: exactly one of `exactly` or "
                          "`firstAvailable` is required")
        subrequests = [exactly] if exactly is not None else first
        if not isinstance(subrequests, list) or not 1 <= len(subrequests) <= 8:
            raise Invalid(f"{where}[{request['name']}].firstAvailable: must have 1 to 8 items")
        for sub in subrequests:
            if not isinstance(sub, dict) or not sub.get("deviceClassName"):
                raise Invalid(f"{where}[{request['name']}]: each needs a deviceClassName")
            if first is not None and not _DNS_LABEL.match(str(sub.get("name", ""))):
                raise Invalid(f"{where}[{request['name']}].firstAvailable: each needs a "
                              "DNS-label name")
            sub.setdefault("allocationMode", "ExactCount")
            sub.setdefault("count", 1)


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
