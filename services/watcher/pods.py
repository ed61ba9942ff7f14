"""What a Pod object from the API server says, read strictly: `PodFacts`, or `MalformedPod`.

Pure: no I/O. The objects arrive as plain JSON dicts (never the client's models, whose
deserialisation fails on the very objects we must skip), and anything odd is refused here with a
sentence, so nothing downstream ever handles a half-read Pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from schemas import ContainerRequest
from schemas.pods import InvalidPodUID, PodPhase, validate_pod_uid

PHASES: frozenset[str] = frozenset(get_args(PodPhase))
TERMINAL: frozenset[str] = frozenset({"Succeeded", "Failed"})


class MalformedPod(ValueError):
    """An object that cannot be read as a Pod of this node; it is skipped and changes nothing."""

    def __init__(self, reason: str, *, uid: str | None = None, where: str | None = None) -> None:
        self.reason = reason
        self.uid = uid
        self.where = where
        label = " ".join(part for part in (where, f"uid {uid!r}" if uid else None) if part)
        super().__init__(f"{label or 'object'}: {reason}")


@dataclass(frozen=True, slots=True)
class Resources:
    """Which extended resources are partkeeper's: a profile prefix and the logical-slice name."""

    prefix: str
    sliced: str

    def ours(self, name: str) -> bool:
        return name.startswith(self.prefix) or name == self.sliced


@dataclass(frozen=True, slots=True)
class PodFacts:
    """The fields of one Pod version that partkeeper cares about."""

    uid: str
    namespace: str
    name: str
    phase: PodPhase
    deleting: bool
    created: str
    containers: tuple[ContainerRequest, ...]
    resource_version: str
    rv: int  # resource_version as a number, for ordering observations

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_rv(value: object) -> int:
    """A resourceVersion as a number; ValueError when it is not a decimal string.

    Kubernetes calls resourceVersions opaque, but deciding "a LIST at a newer version lacks the
    Pod" needs an order; etcd-backed servers (and the simulated one) give decimal integers. An
    unreadable one is refused, which keeps every decision that needs the order from being made.
    """
    if not isinstance(value, str) or not value.isascii() or not value.isdigit():
        raise ValueError(f"resourceVersion {value!r} is not a decimal number")
    return int(value)


def object_rv(obj: object) -> int | None:
    """The resourceVersion of any object (even a malformed Pod), or None."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        return None
    try:
        return parse_rv(metadata.get("resourceVersion"))
    except ValueError:
        return None


def identity(obj: object) -> tuple[str, str] | None:
    """(namespace, name) of an object when both are readable strings, else None."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        return None
    namespace, name = metadata.get("namespace"), metadata.get("name")
    if isinstance(namespace, str) and namespace and isinstance(name, str) and name:
        return namespace, name
    return None


def parse_pod(obj: object, *, node: str, resources: Resources) -> PodFacts:
    """Read `obj` as a Pod bound to `node`; raises MalformedPod saying what is wrong."""
    if not isinstance(obj, dict):
        raise MalformedPod(f"is a {type(obj).__name__}, not a JSON object")
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        raise MalformedPod("has no metadata object")
    ids = identity(obj)
    where = f"{ids[0]}/{ids[1]}" if ids else None
    raw_uid = metadata.get("uid")
    try:
        uid = validate_pod_uid(raw_uid)
    except InvalidPodUID as exc:
        raise MalformedPod(str(exc), where=where) from None
    if ids is None:
        raise MalformedPod("has no namespace and name", uid=uid)
    try:
        rv = parse_rv(metadata.get("resourceVersion"))
    except ValueError as exc:
        raise MalformedPod(str(exc), uid=uid, where=where) from None
    spec, status = obj.get("spec"), obj.get("status")
    if not isinstance(spec, dict) or not isinstance(status, dict):
        raise MalformedPod("has no spec or status object", uid=uid, where=where)
    if spec.get("nodeName") != node:
        raise MalformedPod(f"is bound to {spec.get('nodeName')!r}, not {node!r}", uid=uid,
                           where=where)
    phase = status.get("phase")
    if phase not in PHASES:
        raise MalformedPod(f"has phase {phase!r}", uid=uid, where=where)
    created = metadata.get("creationTimestamp", "")
    if not isinstance(created, str):
        raise MalformedPod(f"has creationTimestamp {created!r}", uid=uid, where=where)
    try:
        containers = _containers(spec, resources)
    except ValueError as exc:
        raise MalformedPod(str(exc), uid=uid, where=where) from None
    return PodFacts(
        uid=uid,
        namespace=ids[0],
        name=ids[1],
        phase=phase,
        deleting=metadata.get("deletionTimestamp") is not None,
        created=created,
        containers=containers,
        resource_version=str(rv),
        rv=rv,
    )


def _containers(spec: Mapping[str, Any], resources: Resources) -> tuple[ContainerRequest, ...]:
    """Init containers then containers, in spec order, each with its requests of our resources.

    Init containers count because kubelet calls Allocate for them too.
    """
    out: list[ContainerRequest] = []
    for field in ("initContainers", "containers"):
        listed = spec.get(field)
        if listed is None and field == "initContainers":
            continue
        if not isinstance(listed, list) or (field == "containers" and not listed):
            raise ValueError(f"spec.{field} is not a non-empty list")
        for container in listed:
            out.append(_container(container, field, resources))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"container names repeat: {names}")
    return tuple(out)


def _container(container: object, field: str, resources: Resources) -> ContainerRequest:
    if not isinstance(container, dict) or not isinstance(container.get("name"), str):
        raise ValueError(f"an entry of spec.{field} has no name")
    name = container["name"]
    declared = _object_or_empty(container.get("resources"))
    if declared is None:
        raise ValueError(f"container {name!r} has resources that are not an object")
    limits = _object_or_empty(declared.get("limits"))
    requests = _object_or_empty(declared.get("requests"))
    if limits is None or requests is None:
        raise ValueError(f"container {name!r} has limits or requests that are not objects")
    wanted: dict[str, int] = {}
    # Extended resources cannot be overcommitted: a limit, when given, is the request.
    for resource in sorted(set(limits) | set(requests)):
        if not isinstance(resource, str) or not resources.ours(resource):
            continue
        raw = limits[resource] if resource in limits else requests[resource]
        quantity = _quantity(raw)
        if quantity is None:
            raise ValueError(f"container {name!r} asks for {raw!r} of {resource}")
        if quantity:
            wanted[resource] = quantity
    return ContainerRequest(name=name, requests=wanted)


def _object_or_empty(value: object) -> dict[str, Any] | None:
    """A JSON object, {} for null/absent, None for anything else."""
    if value is None:
        return {}
    return value if isinstance(value, dict) else None


def _quantity(raw: object) -> int | None:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw if raw >= 0 else None
    if isinstance(raw, str) and raw.isascii() and raw.isdigit():
        return int(raw)
    return None
