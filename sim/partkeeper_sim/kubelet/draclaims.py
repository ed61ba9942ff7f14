"""What the simulated kubelet keeps per prepared ResourceClaim, and which CDI devices a container
gets: pure bookkeeping, after kubelet's DRA manager (k8s.io/kubernetes pkg/kubelet/cm/dra).

- One entry per claim UID, not per Pod: `PrepareResources` adds the Pod to the claim's set and
  calls the plugin only when the claim is not prepared yet; `UnprepareResources` removes the Pod
  and calls the plugin only when no Pod is left (manager.go: `addPodReference`,
  `isPrepared`, `deletePodReference`, `hasPodReference`).
- A container's claim reference (`resources.claims[].name`, optional `.request`) gets the CDI
  ids of the devices whose `request_names` contain that request (a device answered with no
  request names matches any), or of every device when the reference names no request
  (claiminfo.go, `cdiDevicesAsList`). Kubelet compares top-level names: a device
  answered as `gpu/p0` reaches no container asking for request `gpu`.
- The special claim of DRA extended resources (KEP-5004), named in the Pod's
  `status.extendedResourceClaimStatus`, is prepared like any claim; a container gets the CDI ids
  of the devices answered for the request of each `requestMappings` entry that names the
  container and a resource the container requests (manager.go, `GetResources`: per non-zero
  request of the container, the mappings with its container and resource name, then
  `cdiDevicesAsList(rm.RequestName)`): the mapping decides, the request name's `container-<i>-`
  is never read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from partkeeper.kubelet import dra_pb2


@dataclass
class ClaimInfo:
    driver: str
    ref: dra_pb2.Claim
    pods: set[str] = field(default_factory=set)
    devices: list[dra_pb2.Device] = field(default_factory=list)
    prepared: bool = False


def cdi_devices(devices: Iterable[dra_pb2.Device], request: str) -> list[str]:
    """The CDI ids a container referring to the claim with `request` ("" for none) gets."""
    return [cid for device in devices
            if not request or not device.request_names or request in device.request_names
            for cid in device.cdi_device_ids]


# The key of the special claim among a Pod's claim entries (no entry of the spec can have it).
EXTENDED = "\x00extended-resources"


def extended_claim(pod: Mapping[str, Any]) -> str:
    """The special claim's name from the Pod's status, "" when it has none."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    return str(status.get("resourceClaimName") or "")


def mapped_requests(pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    """The special claim's requests `requestMappings` gives to `container`: entries naming it
    and a resource it requests (limits stand in for requests, as the API server defaults
    them for extended resources)."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    resources = container.get("resources") or {}
    asked = {name for name, value in {**(resources.get("limits") or {}),
                                      **(resources.get("requests") or {})}.items()
             if str(value).strip() not in ("", "0")}
    return [str(m.get("requestName")) for m in status.get("requestMappings") or []
            if m.get("containerName") == container.get("name")
            and m.get("resourceName") in asked]


def container_devices(pod: Mapping[str, Any], names: Mapping[str, str],
                      claims: Mapping[str, ClaimInfo]) -> dict[str, list[str]]:
    """Per container, the CDI ids it gets. `names` maps the Pod's claim entries (and EXTENDED,
    for the special claim) to claim UIDs."""
    out: dict[str, list[str]] = {}
    spec = pod.get("spec") or {}
    special = claims.get(names.get(EXTENDED, ""))
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        got: list[str] = []
        for ref in (container.get("resources") or {}).get("claims") or []:
            info = claims.get(names.get(str(ref.get("name")), ""))
            if info is not None:
                got += cdi_devices(info.devices, str(ref.get("request") or ""))
        if special is not None:
            for request in mapped_requests(pod, container):
                got += [cid for device in special.devices if request in device.request_names
                        for cid in device.cdi_device_ids]
        out[str(container.get("name"))] = got
    return out
