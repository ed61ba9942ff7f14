"""The permission model has one source, the table in partkeeper/bus/permissions.py, and is
shipped three times (compose/nats/nats.conf for compose and tests, deploy/nats/accounts.yaml for
the Helm chart, deploy/nats/signing-keys.sh for JWT mode) and used a fourth (the embedded stack's
server). Each must be exactly what the table renders, and grant exactly the table's subjects."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from partkeeper.bus import permissions_render as render
from partkeeper.bus.permissions import ROLES, SERVICES, TOPOLOGY
from partkeeper_sim.stack.natsserver import EmbeddedUsers

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]


def from_conf(text: str) -> dict[str, dict[str, Any]]:
    """user -> {publish: [...], subscribe: [...], allow_responses: bool} from nats.conf."""
    found = {}
    for block in re.split(r'\{user: "', text)[1:]:
        name = block.split('"', 1)[0]
        grants: dict[str, Any] = {"allow_responses": "allow_responses: true" in block}
        for kind in ("publish", "subscribe"):
            match = re.search(kind + r": \{allow: \[(.*?)\](?:, deny: \[(.*?)\])?\}", block,
                              re.S)
            grants[kind] = sorted(re.findall(r'"([^"]+)"', match.group(1))) if match else None
            if kind == "publish":
                denied = match.group(2) if match else None
                grants["deny_publish"] = sorted(re.findall(r'"([^"]+)"', denied or ""))
        found[name] = grants
    return found


def from_values(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    users = doc["config"]["merge"]["accounts"]["PARTKEEPER"]["users"]
    return {
        u["user"]: {
            "allow_responses": bool(u["permissions"].get("allow_responses")),
            "publish": sorted(u["permissions"]["publish"]["allow"]),
            "deny_publish": sorted(u["permissions"]["publish"].get("deny", [])),
            "subscribe": sorted(u["permissions"]["subscribe"]["allow"]),
        }
        for u in users
    }


def test_helm_accounts_grant_what_the_compose_config_grants() -> None:
    conf = from_conf((ROOT / "compose" / "nats" / "nats.conf").read_text())
    conf.pop("pk-admin")  # written `publish: ">"` there; the Helm values' admin is checked below
    values = from_values(yaml.safe_load((ROOT / "deploy" / "nats" / "accounts.yaml").read_text()))
    assert values.pop("pk-admin") == {"allow_responses": False, "publish": [">"],
                                      "deny_publish": [], "subscribe": [">"]}
    assert values == conf


def test_compose_mounts_the_config_and_gives_each_service_its_user() -> None:
    doc = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    nats = doc["services"]["nats"]
    assert "./nats/nats.conf:/etc/nats/nats.conf:ro" in nats["volumes"]
    assert nats["command"][:2] == ["-c", "/etc/nats/nats.conf"]
    for service in ("watcher", "allocator", "reclaimer", "gc"):
        assert doc["services"][service]["environment"]["NATS_USER"] == f"pk-{service}"


def table(node: str) -> dict[str, dict[str, Any]]:
    return {r.user: {"allow_responses": False, "publish": sorted(r.publish),
                     "deny_publish": sorted(r.deny_publish), "subscribe": sorted(r.subscribe)}
            for r in (role.render(node) for role in ROLES)}


@pytest.mark.parametrize(("form", "path"), [
    ("conf", "compose/nats/nats.conf"), ("helm", "deploy/nats/accounts.yaml"),
    ("nsc", "deploy/nats/signing-keys.sh")])
def test_each_shipped_file_is_what_the_table_renders(form: str, path: str) -> None:
    rendered = {"conf": lambda: render.nats_conf(render.SHIPPED_NODE, render.dev_passwords()),
                "helm": render.helm_accounts, "nsc": render.signing_keys}[form]()
    assert (ROOT / path).read_text() == rendered, (
        f"{path} differs from the permission table; regenerate it with "
        f"python -m partkeeper.bus.permissions_render {form} > {path}")


def test_the_compose_config_grants_the_table() -> None:
    conf = from_conf((ROOT / "compose" / "nats" / "nats.conf").read_text())
    conf.pop("pk-admin")
    assert conf == table(render.SHIPPED_NODE)


def test_the_jwt_roles_grant_the_table_with_the_node_as_a_tag() -> None:
    roles = render.parse_signing_keys((ROOT / "deploy" / "nats" / "signing-keys.sh").read_text())
    assert {f"pk-{name}": {"allow_responses": False, "publish": sorted(r.publish),
                           "deny_publish": sorted(r.deny_publish),
                           "subscribe": sorted(r.subscribe)} for name, r in roles.items()} \
        == table(render.TAG)
    # A role may name no node but its own: every node-scoped subject carries the tag.
    for name, role in roles.items():
        for subject in (*role.publish, *role.deny_publish, *role.subscribe):
            assert "sim-node-0" not in subject, (name, subject)


def test_the_embedded_server_grants_the_table(tmp_path: Path) -> None:
    users = EmbeddedUsers.made()
    conf = from_conf(users.write_config(tmp_path / "nats.conf", "gpu.a").read_text())
    conf.pop("pk-admin")
    assert conf == table("gpu_2ea")  # the node's subject token


def test_no_service_may_change_the_topology_and_provision_may_only_change_it() -> None:
    for role in ROLES:
        writes = [s for s in role.publish if s.startswith("$JS.API.STREAM.")
                  and not s.startswith("$JS.API.STREAM.INFO.")]
        if role.name in SERVICES:
            assert writes == [], role.name
            assert not any(s in ("_INBOX.>", ">") for s in role.subscribe), role.name
        else:
            assert sorted(writes) == sorted(f"$JS.API.STREAM.{verb}.{name}" for name in TOPOLOGY
                                            for verb in ("CREATE", "UPDATE"))
            assert not any(s.startswith("pk.") or s.startswith("$KV.")
                           for s in (*role.publish, *role.subscribe))
