"""What the simulated kubelet knows of a Pod: the few fields admission and termination read.

Pods reach the kubelet as Kubernetes JSON (camelCase, as the API server serves them and as the
`kubernetes` client's `sanitize_for_serialization` produces them); `pod_from_manifest` is the one
parser, so the in-memory source and the cluster adapter cannot disagree about a field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# Resource names kubelet handles itself; everything else with a domain is an extended resource.
_NATIVE = frozenset({"cpu", "memory", "ephemeral-storage", "pods", "storage"})


class PodSpecError(ValueError):
    """A Pod manifest lacks a field the kubelet needs or carries a malformed one."""


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    # Extended resources (device-plugin resources) and their whole-number counts.
    devices: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PodView:
    uid: str
    namespace: str
    name: str
    containers: tuple[ContainerView, ...] = ()
    init_containers: tuple[ContainerView, ...] = ()  # run one after another before the others
    cpu_millis: int = 0  # the Pod's effective CPU request (admission's OutOfcpu check)
    node: str = ""
    phase: str = "Pending"
    deletion_requested: bool = False
    created: str = ""
    # The object as the Pod watch delivered it: what kubelet's pod managers hand its DRA
    # manager, which reads the claim entries and statuses from it rather than GETting the Pod.
    manifest: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES


@dataclass(frozen=True, slots=True)
class PodEvent:
    """`upsert`: the Pod as it now is (added or modified); `deleted`: the object is gone."""

    kind: Literal["upsert", "deleted"]
    pod: PodView


def is_extended_resource(name: str) -> bool:
    """True for names like `nvidia.com/mig-1g.10gb` that a device plugin may serve."""
    if name in _NATIVE or name.startswith(("hugepages-", "requests.")) or "/" not in name:
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def dra_mapped(manifest: Mapping[str, Any]) -> dict[str, set[str]]:
    """Per container, the extended resources the Pod's `status.extendedResourceClaimStatus`
    maps to requests of its special ResourceClaim (KEP-5004): DRA serves those, not a device
    plugin."""
    status = (manifest.get("status") or {}).get("extendedResourceClaimStatus") or {}
    out: dict[str, set[str]] = {}
    for entry in status.get("requestMappings") or []:
        out.setdefault(str(entry.get("containerName")), set()).add(str(entry.get("resourceName")))
    return out


def _count(resource: str, raw: object, where: str) -> int:
    text = str(raw).strip()
    if not text.isdigit():
        raise PodSpecError(f"{where}: {resource}={raw!r} is not a whole number of devices")
    return int(text)


def _container(obj: Mapping[str, Any], where: str) -> ContainerView:
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise PodSpecError(f"{where}: a container has no name")
    resources = obj.get("resources") or {}
    # Extended resources must have requests equal to limits; limits are authoritative, and
    # requests alone are accepted because the API server would have defaulted limits from them.
    quantities = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    devices = {
        res: _count(res, qty, f"{where} container {name}")
        for res, qty in sorted(quantities.items())
        if is_extended_resource(res)
    }
    return ContainerView(name=name, devices={k: v for k, v in devices.items() if v > 0})


def _millicores(raw: object, where: str) -> int:
    text = str(raw).strip()
    try:
        return int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)
    except ValueError:
        raise PodSpecError(f"{where}: cpu={raw!r} is not a CPU quantity") from None


def _cpu(obj: Mapping[str, Any], where: str) -> int:
    requests = (obj.get("resources") or {}).get("requests") or {}
    return _millicores(requests["cpu"], where) if "cpu" in requests else 0


def _effective_cpu(spec: Mapping[str, Any], where: str) -> int:
    """kubelet's rule: the larger of the largest init container and the sum of the others."""
    apps = sum(_cpu(c, where) for c in spec.get("containers") or ())
    inits = [_cpu(c, where) for c in spec.get("initContainers") or ()]
    return max([apps, *inits])


def pod_from_manifest(obj: Mapping[str, Any]) -> PodView:
    """The PodView of a Pod in Kubernetes JSON form; PodSpecError names the Pod and the field."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    uid, namespace, name = meta.get("uid"), meta.get("namespace") or "default", meta.get("name")
    if not isinstance(uid, str) or not uid or not isinstance(name, str) or not name:
        raise PodSpecError(f"Pod {namespace}/{name} has no metadata.uid or metadata.name")
    where = f"Pod {namespace}/{name} ({uid})"
    containers = tuple(_container(c, where) for c in spec.get("containers") or ())
    inits = tuple(_container(c, where) for c in spec.get("initContainers") or ())
    return PodView(
        uid=uid,
        namespace=namespace,
        name=name,
        containers=containers,
        init_containers=inits,
        cpu_millis=_effective_cpu(spec, where),
        node=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending",
        deletion_requested=bool(meta.get("deletionTimestamp")),
        created=str(meta.get("creationTimestamp") or ""),
        manifest=obj,
    )


def pod_manifest(
    name: str,
    uid: str,
    containers: Mapping[str, Mapping[str, int]],
    *,
    namespace: str = "default",
    node: str = "",
    init: Mapping[str, Mapping[str, int]] | None = None,
    cpu: str = "",
) -> dict[str, Any]:
    """A minimal Pod manifest: container name -> {resource: count}, likewise the init
    containers; `cpu` is each app container's CPU request. For tests and demos."""
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [_manifest_container(c, d, cpu) for c, d in containers.items()],
        },
        "status": {"phase": "Pending"},
    }
    if init:
        manifest["spec"]["initContainers"] = [
            _manifest_container(c, d, "") for c, d in init.items()
        ]
    return manifest


def _manifest_container(name: str, devices: Mapping[str, int], cpu: str) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": {r: str(n) for r, n in devices.items()}}
    if cpu:
        resources["requests"] = {"cpu": cpu}
    return {"name": name, "image": "busybox", "resources": resources}
