"""Who uses a ResourceClaim's partition, read from the API objects (DRA mode's
`partkeeper_partition_info` labels `pod`, `namespace` and `container`): pure readings of JSON.

- The Pods: the ResourceClaim's `status.reservedFor` entries for Pods (core group, resource
  `pods`), all in the claim's namespace. The scheduler adds a Pod there before it binds it and
  the resourceclaim controller removes it once the Pod is done
  (k8s.io/kubernetes pkg/controller/resourceclaim/controller.go, `syncClaim`), so it is the set
  of Pods the claim serves now, however many share it.
- The containers of one Pod: those whose `resources.claims[].name` names an entry of
  `spec.resourceClaims` that is this claim, directly (`resourceClaimName`) or as the claim made
  from a template (`status.resourceClaimStatuses[].resourceClaimName`, the name the resourceclaim
  controller gave it); and for the claim the scheduler made for extended resources (KEP-5004),
  the containers `status.extendedResourceClaimStatus.requestMappings` names
  (k8s.io/api core/v1 types.go, `PodExtendedResourceClaimStatus`). Init containers count, as
  kubelet prepares claims for them too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class Reservation:
    """One ResourceClaim and the Pods it is reserved for now."""

    uid: str
    namespace: str
    name: str
    pods: tuple[PodRef, ...]


def _object(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def reservation(claim: object) -> Reservation | None:
    """The claim's reserving Pods; None for what is no ResourceClaim with a UID."""
    metadata = _object(_object(claim).get("metadata"))
    uid, namespace, name = (metadata.get(k) for k in ("uid", "namespace", "name"))
    if not (isinstance(uid, str) and uid and isinstance(namespace, str)
            and isinstance(name, str)):
        return None
    pods = {PodRef(str(ref["uid"]), str(ref["name"]))
            for ref in _list(_object(_object(claim).get("status")).get("reservedFor"))
            if isinstance(ref, Mapping) and ref.get("resource") == "pods"
            and not ref.get("apiGroup") and ref.get("uid") and ref.get("name")}
    return Reservation(uid, namespace, name, tuple(sorted(pods)))


def containers_using(pod: object, claim_name: str) -> tuple[str, ...]:
    """The names of the Pod's containers (init containers first, in spec order) that use the
    ResourceClaim named `claim_name` (module docstring)."""
    spec, status = _object(_object(pod).get("spec")), _object(_object(pod).get("status"))
    made = {s.get("name"): s.get("resourceClaimName")
            for s in _list(status.get("resourceClaimStatuses")) if isinstance(s, Mapping)}
    entries = {e.get("name") for e in _list(spec.get("resourceClaims")) if isinstance(e, Mapping)
               and (e.get("resourceClaimName") or made.get(e.get("name"))) == claim_name}
    extended = _object(status.get("extendedResourceClaimStatus"))
    mapped = ({m.get("containerName") for m in _list(extended.get("requestMappings"))
               if isinstance(m, Mapping)}
              if extended.get("resourceClaimName") == claim_name else set())
    found: list[str] = []
    for field in ("initContainers", "containers"):
        for container in _list(spec.get(field)):
            name = _object(container).get("name")
            if not isinstance(name, str) or name in found:
                continue
            asked = {c.get("name") for c in _list(_object(_object(container).get(
                "resources")).get("claims")) if isinstance(c, Mapping)}
            if asked & entries or name in mapped:
                found.append(name)
    return tuple(found)
