"""DRA extended resources (KEP-5004, `DRAExtendedResource`, GA in 1.37), pure: which of a Pod's
extended resources a node serves through DRA, the special ResourceClaim the scheduler makes for
them, and the Pod's `status.extendedResourceClaimStatus`.

As kube-scheduler's dynamicresources plugin does
(pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go):

- a DeviceClass maps the extended resource named by its `spec.extendedResourceName`, and every
  class the implicit `deviceclass.resource.kubernetes.io/<class name>`
  (`resourceToDeviceClass`; an explicit name claimed by two classes is ambiguous and maps
  neither here, where upstream takes the newest: a guess we do not make);
- per node (`filterExtendedResources`): a resource mapped to a class is served through DRA when
  the node's allocatable for it is absent or 0, and by the device plugin when it is above 0;
  a resource neither mapped nor in the node's allocatable does not fit. One name is therefore
  never served both ways on one node: a node whose device plugin still advertises healthy
  devices of it keeps it, and the moment that plugin goes (kubelet reports 0) the name moves;
- the special claim (`createDeviceRequests`) holds one request per container (init containers
  first, then the others) per extended resource served through DRA, named
  `container-<i>-request-<j>`: i the container's index in initContainers + containers, j the
  resource's index among the container's sorted request names (cpu and memory included), with
  `exactly: {deviceClassName, allocationMode: ExactCount, count}`; it is owned by the Pod
  (controller reference), carries the annotation `resource.kubernetes.io/extended-resource-claim`
  and is named from `<pod>-extended-resources-` (`bindClaim` creates it in PreBind);
- `createRequestMappings`: the Pod's `status.extendedResourceClaimStatus` names the claim and
  maps each request to its container and resource (`requestMappings`: containerName,
  resourceName, requestName). Kubelet routes devices by this mapping, never by the request
  name, which the KEP calls informational only.

A container's requests are read as the API server stores them: for an extended resource given
only in `limits`, the requests default to the limits (pkg/apis/core/v1/defaults.go), so limits
stand in for absent requests here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from partkeeper_sim.kubelet.pods import dra_mapped, is_extended_resource

ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"


class DoesNotFit(Exception):
    """An extended resource the node neither advertises nor serves through DRA."""


def class_mapping(classes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name -> DeviceClass name."""
    explicit: dict[str, list[str]] = {}
    mapping: dict[str, str] = {}
    for name, body in classes.items():
        mapping[f"{IMPLICIT_PREFIX}{name}"] = name
        wanted = (body.get("spec") or {}).get("extendedResourceName")
        if wanted:
            explicit.setdefault(str(wanted), []).append(name)
    for resource, names in explicit.items():
        if len(names) == 1:
            mapping[resource] = names[0]
    return mapping


def containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def requests_of(container: Mapping[str, Any]) -> dict[str, str]:
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def _count(raw: object) -> int:
    text = str(raw).strip()
    return int(text) if text.isdigit() else 0


def pod_extended(pod: Mapping[str, Any]) -> dict[str, int]:
    """The extended resources the Pod asks for (summed over its containers), above 0."""
    out: dict[str, int] = {}
    for container in containers(pod):
        for name, raw in requests_of(container).items():
            if is_extended_resource(name) and _count(raw) > 0:
                out[name] = out.get(name, 0) + _count(raw)
    return out


def through_dra(pod: Mapping[str, Any], mapping: Mapping[str, str],
                allocatable: Mapping[str, str]) -> dict[str, int]:
    """The Pod's extended resources this node serves through DRA; raises DoesNotFit."""
    out: dict[str, int] = {}
    for name, count in sorted(pod_extended(pod).items()):
        advertised = _count(allocatable.get(name, "0"))
        if name in mapping and advertised == 0:
            out[name] = count
        elif name not in mapping and name not in allocatable:
            raise DoesNotFit(f"Insufficient {name}: no device plugin advertises it and no "
                             "DeviceClass maps it")
    return out


def device_requests(pod: Mapping[str, Any], served: Mapping[str, int],
                    mapping: Mapping[str, str]) -> list[dict[str, Any]]:
    requests = []
    for i, container in enumerate(containers(pod)):
        asked = requests_of(container)
        keys = sorted(asked)
        for name in keys:
            if name not in served or _count(asked[name]) == 0:
                continue
            requests.append({"name": f"container-{i}-request-{keys.index(name)}", "exactly": {
                "deviceClassName": mapping[name], "allocationMode": "ExactCount",
                "count": _count(asked[name])}})
    return requests


def special_claim(pod: Mapping[str, Any], served: Mapping[str, int],
                  mapping: Mapping[str, str]) -> dict[str, Any]:
    """The ResourceClaim for the Pod's DRA-served extended resources, before it is created."""
    meta = pod["metadata"]
    return {
        "metadata": {
            "generateName": f"{meta['name']}-extended-resources-",
            "namespace": meta.get("namespace", "default"),
            "annotations": {ANNOTATION: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "spec": {"devices": {"requests": device_requests(pod, served, mapping)}},
    }


def request_mappings(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> list[dict[str, str]]:
    names = {r["name"] for r in claim["spec"]["devices"]["requests"]}
    out = []
    for i, container in enumerate(containers(pod)):
        keys = sorted(requests_of(container))
        for j, resource in enumerate(keys):
            request = f"container-{i}-request-{j}"
            if request in names:
                out.append({"containerName": str(container.get("name")),
                            "resourceName": resource, "requestName": request})
    return out


def made_for(pod: Mapping[str, Any], found: Sequence[Mapping[str, Any]]
             ) -> Mapping[str, Any] | None:
    """The Pod's special claim among `found`: annotated, and owned by the Pod."""
    uid = pod["metadata"]["uid"]
    for claim in found:
        meta = claim.get("metadata") or {}
        if ANNOTATION in (meta.get("annotations") or {}) and any(
                r.get("uid") == uid and r.get("controller")
                for r in meta.get("ownerReferences") or []):
            return claim
    return None


def claim_status(claim_name: str, mappings: list[dict[str, str]]) -> dict[str, Any]:
    return {"resourceClaimName": claim_name, "requestMappings": mappings}


def device_plugin_shortage(pod: Mapping[str, Any], served: Mapping[str, int],
                           allocatable: Mapping[str, str],
                           others: Sequence[Mapping[str, Any]]) -> str | None:
    """NodeResourcesFit for the Pod's extended resources the device plugin serves: what the node
    advertises, less what the other Pods bound to it ask outside their DRA mappings; the reason
    the Pod does not fit, or None (pkg/scheduler/framework/plugins/noderesources/fit.go)."""
    used: dict[str, int] = {}
    for other in others:
        by_dra = dra_mapped(other)
        for container in containers(other):
            skip = by_dra.get(str(container.get("name")), set())
            for name, raw in requests_of(container).items():
                if is_extended_resource(name) and name not in skip:
                    used[name] = used.get(name, 0) + _count(raw)
    for name, count in sorted(pod_extended(pod).items()):
        if name in served:
            continue
        if count + used.get(name, 0) > _count(allocatable.get(name, "0")):
            return f"Insufficient {name}"
    return None
