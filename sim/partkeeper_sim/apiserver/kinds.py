"""What each resource is: its kind, defaults on create, and which fields an update may change.

The store is generic; everything that differs between Pods, Nodes and Events lives here, so the
rules a reader looks for ("can a status patch change the spec?") are in one place.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from . import resource
from .clone import clone
from .discovery import VERSION
from .errors import Invalid

# Metadata the server owns: no create body or update may set these.
SYSTEM_METADATA = (
    "uid",
    "creationTimestamp",
    "resourceVersion",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "generation",
    "managedFields",
)

DEFAULT_GRACE_SECONDS = 30
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def metadata_of(obj: Any) -> dict[str, Any]:
    """The metadata of an object, or an empty dict for an injected object without one."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def well_formed(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("metadata"), dict)


@dataclass(frozen=True)
class Kind:
    resource: str
    kind: str
    api_version: str
    namespaced: bool
    has_status: bool
    prepare: Callable[[dict[str, Any]], None]


def _prepare_pod(pod: dict[str, Any]) -> None:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise Invalid(f'Pod "{_name(pod)}" is invalid: spec: Required value')
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise Invalid(f'Pod "{_name(pod)}" is invalid: spec.containers: Required value')
    for container in containers:
        if not isinstance(container, dict) or not container.get("name"):
            raise Invalid(f'Pod "{_name(pod)}" is invalid: spec.containers.name: Required value')
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    spec.setdefault("schedulerName", "default-scheduler")
    status = pod.setdefault("status", {})
    if not isinstance(status, dict):
        raise Invalid(f'Pod "{_name(pod)}" is invalid: status: must be an object')
    status.setdefault("phase", "Pending")


_NODE_INFO = {
    "architecture": "amd64",
    "containerRuntimeVersion": "sim://1.0",
    "kernelVersion": "6.0.0-sim",
    "kubeProxyVersion": "",
    "kubeletVersion": VERSION["gitVersion"],  # one release for the node and the server
    "operatingSystem": "linux",
    "osImage": "partkeeper simulated node",
}


def _prepare_node(node: dict[str, Any]) -> None:
    name = _name(node)
    labels = node["metadata"].setdefault("labels", {})
    labels.setdefault("kubernetes.io/hostname", name)
    labels.setdefault("kubernetes.io/os", "linux")
    node.setdefault("spec", {})
    status = node.setdefault("status", {})
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    status.setdefault("capacity", dict(resources))
    status.setdefault("allocatable", dict(resources))
    status.setdefault(
        "conditions",
        [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated"}],
    )
    # The client's models require every nodeInfo field, so all are filled.
    status.setdefault("nodeInfo", dict(_NODE_INFO, machineID=name, systemUUID=name, bootID=name))


def _prepare_event(event: dict[str, Any]) -> None:
    if not isinstance(event.get("involvedObject", {}), dict):
        raise Invalid(f'Event "{_name(event)}" is invalid: involvedObject: must be an object')


def _name(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


KINDS: dict[str, Kind] = {
    "pods": Kind("pods", "Pod", "v1", True, True, _prepare_pod),
    "nodes": Kind("nodes", "Node", "v1", False, True, _prepare_node),
    "events": Kind("events", "Event", "v1", True, False, _prepare_event),
    **{
        plural: Kind(plural, kind, resource.API_VERSION, namespaced, status,
                     resource.PREPARE[plural])
        for plural, (kind, namespaced, status) in resource.RESOURCES.items()
    },
}


def new_object(kind: Kind, body: dict[str, Any], namespace: str, now: datetime) -> dict[str, Any]:
    """The object a create stores: body, server-owned metadata and the kind's defaults."""
    obj = clone(body)
    obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
    metadata = obj.setdefault("metadata", {})
    if not isinstance(metadata, dict):
        raise Invalid(f"{kind.kind} is invalid: metadata: must be an object")
    for key in SYSTEM_METADATA:
        metadata.pop(key, None)
    if not metadata.get("name") and metadata.get("generateName"):
        metadata["name"] = f"{metadata['generateName']}{uuid.uuid4().hex[:5]}"
    if not metadata.get("name"):
        raise Invalid(
            f"{kind.kind} is invalid: metadata.name: Required value: name or "
            "generateName is required"
        )
    if kind.namespaced:
        metadata["namespace"] = namespace
    else:
        metadata.pop("namespace", None)
    metadata["uid"] = str(uuid.uuid4())
    metadata["creationTimestamp"] = timestamp(now)
    kind.prepare(obj)
    return obj


def updated_object(
    kind: Kind, current: dict[str, Any], proposed: dict[str, Any], subresource: str | None
) -> dict[str, Any]:
    """What an update of the main resource or of `/status` may change, the rest kept.

    As on the real server: the main resource ignores `status`; `/status` changes only the status
    and (for Pods) labels and annotations. Server-owned metadata is never taken from a client.
    """
    new_meta = metadata_of(proposed)
    if subresource == "status":
        result = clone(current)
        result["status"] = clone(proposed.get("status", {}))
        for key in ("labels", "annotations"):
            _take(result["metadata"], new_meta, key)
        return result
    if kind.has_status:
        result = clone(current)
        result["spec"] = _checked_spec(kind, current, proposed)
    else:
        # Kinds without a status subresource (Events) take the whole body.
        result = {k: clone(v) for k, v in proposed.items() if k != "metadata"}
        result["metadata"] = clone(current["metadata"])
        result["kind"], result["apiVersion"] = kind.kind, kind.api_version
    for key in ("labels", "annotations", "finalizers", "ownerReferences"):
        _take(result["metadata"], new_meta, key)
    return result


def _checked_spec(kind: Kind, current: dict[str, Any], proposed: dict[str, Any]) -> Any:
    spec = clone(proposed.get("spec", {}))
    if kind.resource == "pods" and spec != current.get("spec"):
        # The real server allows a few spec changes (images, tolerations); nothing here needs
        # them, and refusing all keeps a Pod's identity fixed once created.
        raise Invalid(
            f'Pod "{_name(current)}" is invalid: spec: Forbidden: pod updates may not change '
            "the spec in the simulated API server"
        )
    return spec


def _take(target: dict[str, Any], source: dict[str, Any], key: str) -> None:
    if key in source and source[key] is not None:
        target[key] = clone(source[key])
    else:
        target.pop(key, None)


def grace_seconds(pod: dict[str, Any], requested: int | None) -> int:
    """The deletion grace period of a Pod, as the real Pod strategy computes it."""
    spec = found if isinstance(found := pod.get("spec"), dict) else {}
    status = found if isinstance(found := pod.get("status"), dict) else {}
    period = requested
    if period is None:
        period = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    if not isinstance(period, int):
        period = DEFAULT_GRACE_SECONDS
    if not spec.get("nodeName") or status.get("phase") in TERMINAL_PHASES:
        return 0
    return 1 if period < 0 else int(period)


def mark_terminating(pod: dict[str, Any], grace: int, now: datetime) -> dict[str, Any]:
    terminating = clone(pod)
    terminating["metadata"]["deletionTimestamp"] = timestamp(now + timedelta(seconds=grace))
    terminating["metadata"]["deletionGracePeriodSeconds"] = grace
    return terminating
