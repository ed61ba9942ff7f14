"""The compose file and the Kubernetes manifests validate offline against their schemas.

Validators: check-jsonschema with its vendored Compose Specification schema for compose/, and
`kubectl kustomize` + kubernetes-validate (the Kubernetes OpenAPI schemas, strict) for deploy/.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("watcher", "allocator", "reclaimer", "gc")


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run(
        [str(exe), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True, text=True, timeout=120,
    )


def test_compose_file_validates() -> None:
    result = _check_compose(ROOT / "compose" / "docker-compose.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_validator_rejects_a_broken_file(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    doc["services"]["nats"]["restart_policy_typo"] = "always"
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(doc))
    assert _check_compose(broken).returncode != 0


def test_compose_runs_every_service_and_the_simulated_cluster() -> None:
    doc = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    names = set(doc["services"])
    assert {"nats", "jaeger", "simcluster", *SERVICES} <= names
    for svc in SERVICES:
        assert doc["services"][svc]["command"] == ["run", svc]


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; `kubectl kustomize deploy/` cannot be checked")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy")], capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_rendered_manifests_validate_strictly(rendered: list[dict]) -> None:
    for doc in rendered:
        kubernetes_validate.validate(doc, "1.30", strict=True)


def test_daemonset_runs_the_four_services(rendered: list[dict]) -> None:
    (ds,) = [d for d in rendered if d["kind"] == "DaemonSet"]
    containers = ds["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == list(SERVICES)
    assert [c["args"] for c in containers] == [["run", s] for s in SERVICES]
    for c in containers:
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["PK_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_rbac_grants_only_what_is_used(rendered: list[dict]) -> None:
    (role,) = [d for d in rendered if d["kind"] == "ClusterRole"]
    grants = {
        (group, res, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    assert grants == {
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
        ("", "events", "create"), ("events.k8s.io", "events", "create"),
    }
