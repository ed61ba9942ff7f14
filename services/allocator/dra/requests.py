"""What one ResourceClaim asks this node to prepare: a pure reading of the claim's JSON.

Kubelet names a claim by namespace, name and UID. The claim read from the API server must have
that UID (a claim deleted and re-created under the same name is another claim), an allocation,
and a Pod in `status.reservedFor`; every allocated device of our driver must be in this node's
pool and name a placement of our cards. Anything else is a `NotPreparable` whose message says
what was found, and nothing is prepared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from partkeeper.dra import DRIVER, devices
from partkeeper.dra.devices import DeviceSpec
from partkeeper.drivers import Card


class NotPreparable(Exception):
    """The claim cannot be prepared here; the message is the claim's error for kubelet."""


@dataclass(frozen=True, slots=True)
class Asked:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class Wanted:
    """One device of one claim to prepare: which partition, for which Pod."""

    asked: Asked
    pod_uid: str
    pod_name: str
    request: str
    device: str
    spec: DeviceSpec

    @property
    def claim_id(self) -> str:
        return claim_id(self.asked.uid, self.device)


def top_level(request: str) -> str:
    """The request a result names, without its subrequest (`gpu/p0` -> `gpu`): kubelet matches
    containers by top-level names (pkg/kubelet/cm/dra/claiminfo.go, `cdiDevicesAsList`)."""
    return request.split("/", 1)[0]


def claim_id(claim_uid: str, device: str) -> str:
    """The partkeeper claim of one allocated device: ResourceClaim UID and device name."""
    return f"{claim_uid}.{device}"


def _pod(asked: Asked, status: dict[str, Any]) -> tuple[str, str]:
    for ref in status.get("reservedFor") or []:
        is_pod = isinstance(ref, dict) and ref.get("resource") == "pods"
        if is_pod and not ref.get("apiGroup") and ref.get("uid") and ref.get("name"):
            return str(ref["uid"]), str(ref["name"])
    raise NotPreparable(f"{asked} is reserved for no Pod (status.reservedFor has none); "
                        "nothing was prepared")


def wanted(claim: Any, asked: Asked, node: str, cards: Sequence[Card]) -> list[Wanted]:
    """The devices of our driver allocated to `claim`. Raises NotPreparable."""
    metadata = claim.get("metadata") if isinstance(claim, dict) else None
    if not isinstance(metadata, dict):
        raise NotPreparable(f"{asked}: the API server's answer is not a ResourceClaim")
    if metadata.get("uid") != asked.uid:
        raise NotPreparable(f"{asked}: the ResourceClaim of that name has UID "
                            f"{metadata.get('uid')} (deleted and re-created); nothing was prepared")
    status = claim.get("status") if isinstance(claim.get("status"), dict) else {}
    allocation = status.get("allocation")
    results = (allocation or {}).get("devices", {}).get("results") if isinstance(
        allocation, dict) else None
    if not isinstance(results, list):
        raise NotPreparable(f"{asked} is not allocated (no status.allocation); nothing was "
                            "prepared")
    pod_uid, pod_name = _pod(asked, status)
    found: list[Wanted] = []
    for result in results:
        if not isinstance(result, dict) or result.get("driver") != DRIVER:
            continue
        device = str(result.get("device", ""))
        if result.get("pool") != node:
            raise NotPreparable(f"{asked}: device {device} is in pool {result.get('pool')!r}, "
                                f"not this node's ({node}); nothing was prepared")
        spec = devices.parse(device, cards)
        if spec is None:
            raise NotPreparable(f"{asked}: device {device!r} names no placement of this node's "
                                "cards; nothing was prepared")
        found.append(Wanted(asked, pod_uid, pod_name, str(result.get("request", "")), device,
                            spec))
    return found
