"""The provisioning Job (deploy/base/provision-job.yaml): `partkeeper provision` as its own NATS
identity, from its own Secret, with nothing of a node's; the static-users component gives it the
`pk-provision` user (docs/operations.md, "Provisioning")."""

from __future__ import annotations

from pathlib import Path

from tests_support.manifests import DEPLOY, one, render


def _job(directory: Path) -> dict:
    return one(render(directory), "Job")


def test_the_job_provisions_with_its_own_credentials_and_nothing_of_a_node() -> None:
    job = _job(DEPLOY)
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"][0] == "provision"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NATS_CREDS"] == "/etc/partkeeper/nats/provision.creds"
    (volume,) = spec["volumes"]
    assert volume["secret"]["secretName"] == "partkeeper-nats-provision"
    assert not any("hostPath" in v for v in spec["volumes"])
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (config,) = [e["configMapRef"]["name"] for e in container["envFrom"]]
    daemonset = one(render(DEPLOY), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    # the agents' ConfigMap (its name carries the hash): NATS_URL and PK_STREAM_REPLICAS
    assert config == daemonset["envFrom"][0]["configMapRef"]["name"]


def test_static_users_give_the_job_the_provisioning_user() -> None:
    job = _job(DEPLOY / "overlays" / "static-users")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert "NATS_CREDS" not in env and env["NATS_USER"]["value"] == "pk-provision"
    assert env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "partkeeper-nats-passwords", "key": "provision"}
    assert not job["spec"]["template"]["spec"].get("volumes")
