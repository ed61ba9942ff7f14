"""What the simulated kubelet writes in `status.containerStatuses[].allocatedResourcesStatus`
(KEP-4680, gate `ResourceHealthStatus`, on by default since 1.36): pure functions.

As kubelet 1.36 builds it:

- device plugins (pkg/kubelet/cm/devicemanager/manager.go, `UpdateAllocatedResourcesStatus`):
  one entry per extended resource the container holds, `name` the resource
  (`nvidia.com/mig-1g.10gb`), `resources[]` one per device ID it was allocated, `resourceID` the
  device ID, `health` the plugin's last ListAndWatch word for it: `Healthy`, `Unhealthy`, or
  `Unknown` for an ID the plugin no longer lists;
- DRA (pkg/kubelet/cm/dra/manager.go, `UpdateAllocatedResourcesStatus`): one entry per claim
  reference of the container (`resources.claims[]`), `name` `claim:<name>` or
  `claim:<name>/<request>`, `resources[]` every device prepared for that claim, `resourceID`
  `<driver>/<pool>/<device>` (the form the API's `ResourceID` documents for DRA), `health` from
  the driver's resource-health stream (`Unknown` for a device the stream has not named, or
  named longer ago than its timeout: pkg/kubelet/cm/dra/healthinfo.go, `getHealthInfo`), with
  the stream's `message` when it gave one; entries with no device are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"
DEFAULT_TIMEOUT = 30.0  # healthinfo.go, DefaultHealthTimeout

Statuses = dict[str, list[dict[str, Any]]]  # container name -> allocatedResourcesStatus


def device_plugin_status(devices: Mapping[str, Iterable[str]],
                         listed: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
    """One container's entries: `devices` resource -> the IDs it holds, `listed` resource ->
    ID -> the plugin's health word."""
    out = []
    for resource in sorted(devices):
        known = listed.get(resource, {})
        resources = [{"resourceID": device, "health": _word(known.get(device))}
                     for device in devices[resource]]
        if resources:
            out.append({"name": resource, "resources": resources})
    return out


def _word(said: str | None) -> str:
    return said if said in (HEALTHY, UNHEALTHY) else UNKNOWN


@dataclass(frozen=True, slots=True)
class Reported:
    """What the health stream last said of one device."""

    health: str
    message: str
    at: float  # monotonic seconds when it arrived
    timeout: float = DEFAULT_TIMEOUT


def dra_status(container: Mapping[str, Any], devices: Mapping[str, list[tuple[str, str, str]]],
               reported: Mapping[tuple[str, str, str], Reported], now: float
               ) -> list[dict[str, Any]]:
    """One container's entries: `container` its spec, `devices` the Pod's claim entry name ->
    the (driver, pool, device) prepared for it, `reported` what the streams said."""
    out = []
    for ref in (container.get("resources") or {}).get("claims") or []:
        name, request = str(ref.get("name") or ""), str(ref.get("request") or "")
        resources = []
        for key in devices.get(name, []):
            seen = reported.get(key)
            fresh = seen is not None and now - seen.at <= seen.timeout
            entry: dict[str, Any] = {"resourceID": "/".join(key),
                                     "health": _word(seen.health) if fresh and seen else UNKNOWN}
            if fresh and seen and seen.message:
                entry["message"] = seen.message
            resources.append(entry)
        if resources:
            out.append({"name": f"claim:{name}/{request}" if request else f"claim:{name}",
                        "resources": resources})
    return out
