"""The compose file and the Kubernetes manifests validate offline against their schemas, and the
rendered objects have the properties a real GPU node needs.

Validators: check-jsonschema with its vendored Compose Specification schema for compose/;
`kubectl kustomize` (kustomize v5 built into kubectl) renders deploy/, every overlay, and the
base with each component alone, and kubernetes-validate checks every object strictly against the
Kubernetes OpenAPI schemas (unknown fields are errors). The PodMonitor is a CRD the validator has
no schema for; its fields are asserted here instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from partkeeper.dra.classes import extended_classes
from tests_support.manifests import (
    DEPLOY,
    K8S_VERSION,
    ROOT,
    SERVICES,
    containers,
    env,
    host_paths,
    mounts,
    one,
    pod,
    render,
    validate,
    with_components,
)

OVERLAYS = sorted(p.parent.relative_to(DEPLOY).as_posix()
                  for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
COMPONENTS = sorted(p.parent.name for p in (DEPLOY / "components").glob("*/kustomization.yaml"))


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
    for svc, port in zip(SERVICES, (9401, 9402, 9403, 9404), strict=True):
        assert doc["services"][svc]["command"] == ["run", svc]
        assert f"http://127.0.0.1:{port}/readyz" in doc["services"][svc]["healthcheck"]["test"][-1]
    assert doc["x-service"]["build"]["args"]["EXTRAS"] == "sim"  # the simulator is in this image


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(DEPLOY)


@pytest.mark.parametrize("overlay", [".", *OVERLAYS])
def test_every_overlay_renders_and_validates_strictly(overlay: str) -> None:
    docs = render(DEPLOY / overlay)
    validate(docs)
    assert [c["name"] for c in pod(docs)["containers"]] == list(SERVICES)


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_component_renders_alone_and_validates(component: str, tmp_path: Path) -> None:
    validate(render(with_components(tmp_path, component)))


def test_the_validator_refuses_an_unknown_field(base: list[dict[str, Any]]) -> None:
    ds = one(base, "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["runAsUserTypo"] = 0
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


def test_daemonset_runs_the_four_services(base: list[dict[str, Any]]) -> None:
    for name, c in containers(base).items():
        assert c["args"] == ["run", name]
        assert env(c)["PK_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_namespace_admits_privileged_pods(base: list[dict[str, Any]]) -> None:
    labels = one(base, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_each_service_runs_with_exactly_its_identity(base: list[dict[str, Any]]) -> None:
    by = {n: c["securityContext"] for n, c in containers(base).items()}
    assert by["watcher"]["runAsUser"] == 10001 and by["watcher"]["runAsNonRoot"] is True
    for name in ("allocator", "reclaimer"):  # root, for the kubelet's dirs and the MIG caps
        assert by[name]["runAsUser"] == 0
        assert not by[name].get("privileged")
    # the allocator also makes the MIG capability nodes its replies name (devices.py)
    assert by["allocator"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN", "MKNOD"]}
    assert by["reclaimer"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert by["gc"]["runAsUser"] == 0  # the owner of what the allocator writes, nothing more
    for name in ("watcher", "gc"):
        assert by[name]["capabilities"] == {"drop": ["ALL"]}
    for sc in by.values():
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert pod(base)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_host_paths_go_only_where_they_are_written(base: list[dict[str, Any]]) -> None:
    assert host_paths(base, "watcher") == set()
    assert host_paths(base, "allocator") == {
        "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources",
        "/var/lib/partkeeper/pods", "/dev/nvidia-caps"}
    # made on the host at the path a reply names (PK_DRIVER_ROOT=/): mounted at itself, writable
    caps = mounts(base, "allocator")["/dev/nvidia-caps"]
    assert caps["hostPath"]["path"] == "/dev/nvidia-caps" and not caps["mount"].get("readOnly")
    assert host_paths(base, "reclaimer") == host_paths(base, "gc") == {"/var/lib/partkeeper/pods"}
    pods_dir = mounts(base, "gc")["/var/lib/partkeeper/pods"]
    assert not pods_dir["mount"].get("readOnly")  # the GC removes what it collects


def test_nvml_comes_from_the_nvidia_container_toolkit(base: list[dict[str, Any]]) -> None:
    assert pod(base)["runtimeClassName"] == "nvidia"
    for name in ("allocator", "reclaimer"):
        e = env(containers(base)[name])
        assert e["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert "utility" in e["NVIDIA_DRIVER_CAPABILITIES"].split(",")
        assert e["NVIDIA_MIG_CONFIG_DEVICES"] == "all"
        assert e["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    for name in ("watcher", "gc"):
        assert env(containers(base)[name])["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_credentials_reach_only_their_own_container(base: list[dict[str, Any]]) -> None:
    for name, c in containers(base).items():
        path = env(c)["NATS_CREDS"]
        assert path == f"/etc/partkeeper/nats/{name}.creds"
        secrets = [v for v in mounts(base, name).values() if "secret" in v]
        assert [[i["key"] for i in s["secret"]["items"]] for s in secrets] == [[f"{name}.creds"]]
    # the watcher's file is readable by its UID through the Pod's fsGroup
    watcher = mounts(base, "watcher")["/etc/partkeeper/nats"]["secret"]
    assert watcher["defaultMode"] == 0o440 and pod(base)["securityContext"]["fsGroup"] == 10001


def test_only_the_watcher_has_an_api_token(base: list[dict[str, Any]]) -> None:
    assert pod(base)["automountServiceAccountToken"] is False
    assert one(base, "ServiceAccount")["automountServiceAccountToken"] is False
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert [n for n in SERVICES if token in mounts(base, n)] == ["watcher"]
    sources = mounts(base, "watcher")[token]["projected"]["sources"]
    assert {next(iter(s)) for s in sources} == {"serviceAccountToken", "configMap", "downwardAPI"}


def test_probes_hit_the_health_endpoints(base: list[dict[str, Any]]) -> None:
    for c in containers(base).values():
        (port,) = c["ports"]
        assert port["name"] == "metrics"
        assert c["startupProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_requests_cover_the_measured_working_set(base: list[dict[str, Any]]) -> None:
    """docs/benchmarks.md "Service footprint": peak RSS under the demo and idle, rounded up."""
    measured_mib = {"watcher": 101, "allocator": 63, "reclaimer": 62, "gc": 60}
    for name, c in containers(base).items():
        requests, limits = c["resources"]["requests"], c["resources"]["limits"]
        assert _mib(requests["memory"]) >= measured_mib[name]
        assert _mib(limits["memory"]) >= 2 * _mib(requests["memory"])
        assert "cpu" in requests and "cpu" not in limits  # never throttle a kubelet callback


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


def test_rbac_grants_only_what_is_used(base: list[dict[str, Any]]) -> None:
    grants = {
        (group, res, verb)
        for rule in one(base, "ClusterRole")["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    assert grants == {("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
                      ("", "events", "create"), ("", "nodes", "patch")}


def test_a_nodes_token_may_change_only_its_own_node(base: list[dict[str, Any]]) -> None:
    """RBAC lets the account patch every Node; the ValidatingAdmissionPolicy of the base holds a
    write to the Node its token is bound to, and to partkeeper.io/ labels and annotations, as
    the DRA component's policy does for ResourceSlices. Rendered, validated strictly, bound."""
    policy = next(d for d in base if d["kind"] == "ValidatingAdmissionPolicy"
                  and d["metadata"]["name"] == "partkeeper-nodes")
    binding = next(d for d in base if d["kind"] == "ValidatingAdmissionPolicyBinding"
                   and d["spec"]["policyName"] == "partkeeper-nodes")
    validate([policy, binding])
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes"] and "UPDATE" in rule["operations"]
    account = one(base, "ClusterRoleBinding")["subjects"][0]
    (match,) = spec["matchConditions"]
    username = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert f'"{username}"' in match["expression"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["tokenNode"]
    checks = " ".join(v["expression"] for v in spec["validations"])
    assert "variables.tokenNode == variables.node.metadata.name" in checks
    assert "partkeeper.io/" in checks and "object.?spec == oldObject.?spec" in checks


def _settings(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The settings ConfigMap (deploy/ also renders the Grafana dashboard's)."""
    return one([d for d in docs if "grafana_dashboard" not in d["metadata"].get("labels", {})],
               "ConfigMap")


def test_a_changed_setting_rolls_the_daemonset(base: list[dict[str, Any]]) -> None:
    example = render(DEPLOY / "overlays" / "example")
    name = _settings(base)["metadata"]["name"]
    assert name.startswith("partkeeper-")
    assert _settings(example)["metadata"]["name"] != name
    for docs in (base, example):
        refs = {c["envFrom"][0]["configMapRef"]["name"] for c in pod(docs)["containers"]}
        assert refs == {_settings(docs)["metadata"]["name"]}


def test_example_overlay_sets_the_operators_choices() -> None:
    docs = render(DEPLOY / "overlays" / "example")
    data = one(docs, "ConfigMap")["data"]
    assert data["NATS_URL"].count("nats://") == 3 and data["PK_STREAM_REPLICAS"] == "3"
    spec = pod(docs)
    assert spec["nodeSelector"]["partkeeper.io/agent"] == "true"
    assert spec["priorityClassName"] == one(docs, "PriorityClass")["metadata"]["name"]
    monitor = one(docs, "PodMonitor")
    assert monitor["metadata"]["namespace"] == "partkeeper"
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "partkeeper"}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    for name in SERVICES:  # per-node credentials: this node's files, each in its own container
        (volume,) = [v for v in mounts(docs, name).values() if v["mount"]["mountPath"]
                     == "/etc/partkeeper/nats"]
        assert volume["hostPath"] == {"path": f"/etc/partkeeper/nats/{name}", "type": "Directory"}


def test_static_users_get_their_own_password_only() -> None:
    docs = render(DEPLOY / "overlays" / "static-users")
    for name, c in containers(docs).items():
        e = env(c)
        assert "NATS_CREDS" not in e and e["NATS_USER"] == f"pk-{name}"
        assert e["NATS_PASSWORD"] == {"secretKeyRef": {"name": "partkeeper-nats-passwords",
                                                       "key": name}}
        assert "/etc/partkeeper/nats" not in mounts(docs, name)
    assert not any("secret" in v for v in pod(docs)["volumes"])


def test_host_driver_overlay_loads_nvml_from_the_driver_root() -> None:
    docs = render(DEPLOY / "overlays" / "host-driver")
    assert "runtimeClassName" not in pod(docs)
    for name in ("allocator", "reclaimer"):
        root = mounts(docs, name)["/driver-root"]
        assert root["hostPath"]["path"] == "/" and root["mount"]["readOnly"] is True
        assert "/driver-root/usr/lib/x86_64-linux-gnu" in env(containers(docs)[name])[
            "LD_LIBRARY_PATH"]
        assert containers(docs)[name]["securityContext"]["privileged"] is True
    for name in ("watcher", "gc"):
        assert not containers(docs)[name]["securityContext"].get("privileged")


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, res, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for res in rule["resources"] for verb in rule["verbs"]}


def test_cdi_component_gives_the_spec_dir_to_its_writer_and_its_remover(tmp_path: Path) -> None:
    docs = render(with_components(tmp_path, "cdi"))
    data = one(docs, "ConfigMap")["data"]
    assert (data["PK_DEVICE_LIST_STRATEGY"], data["PK_CDI_DIR"]) == ("cdi", "/var/run/cdi")
    holders = [n for n in SERVICES if "/var/run/cdi" in mounts(docs, n)]
    assert holders == ["allocator", "reclaimer"]
    assert mounts(docs, "allocator")["/var/run/cdi"]["hostPath"]["path"] == "/var/run/cdi"


def test_dra_component_gives_the_allocator_what_dra_mode_uses(tmp_path: Path) -> None:
    docs = render(with_components(tmp_path, "dra"))
    data = one(docs, "ConfigMap")["data"]
    assert data["PK_MODE"] == "dra"
    allocator = mounts(docs, "allocator")
    # the driver's own plugin dir, not the kubelet's plugins dir with other drivers' sockets
    own = f"{data['PK_KUBELET_PLUGINS_DIR']}/partitions.partkeeper.io"
    assert data["PK_KUBELET_PLUGINS_DIR"] not in allocator
    for path in (own, data["PK_KUBELET_REGISTRY_DIR"], data["PK_CDI_DIR"]):
        assert allocator[path]["hostPath"]["path"] == path
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert [n for n in SERVICES if token in mounts(docs, n)] == ["watcher", "allocator"]
    assert [n for n in SERVICES if data["PK_CDI_DIR"] in mounts(docs, n)] == [
        "allocator", "reclaimer"]
    classes = {d["metadata"]["name"] for d in docs if d["kind"] == "DeviceClass"}
    per_profile = {c["metadata"]["name"] for c in extended_classes()}
    assert classes == {"partitions.partkeeper.io", *per_profile}, "and one per profile"


def test_dra_component_grants_exactly_the_dra_calls(tmp_path: Path) -> None:
    docs = render(with_components(tmp_path, "dra"))
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    verbs = ("get", "list", "watch", "create", "update", "delete")
    assert _grants(roles["partkeeper-dra"]) == {
        *(("resource.k8s.io", "resourceslices", v) for v in verbs),
        *(("resource.k8s.io", "resourceclaims", v) for v in ("get", "list", "watch")),
        ("", "nodes", "get"), ("", "pods", "get")}
    bindings = {d["roleRef"]["name"]: d for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert bindings["partkeeper-dra"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "partkeeper", "namespace": "partkeeper"}]
