"""The permission model is shipped twice (compose/nats/nats.conf for compose and tests,
deploy/nats/accounts.yaml for the Helm chart): both must grant exactly the same subjects."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]


def from_conf(text: str) -> dict[str, dict[str, Any]]:
    """user -> {publish: [...], subscribe: [...], allow_responses: bool} from nats.conf."""
    found = {}
    for block in re.split(r'\{user: "', text)[1:]:
        name = block.split('"', 1)[0]
        grants: dict[str, Any] = {"allow_responses": "allow_responses: true" in block}
        for kind in ("publish", "subscribe"):
            match = re.search(kind + r": \{allow: \[(.*?)\]\}", block, re.S)
            grants[kind] = sorted(re.findall(r'"([^"]+)"', match.group(1))) if match else None
        found[name] = grants
    return found


def from_values(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    users = doc["config"]["merge"]["accounts"]["PARTKEEPER"]["users"]
    return {
        u["user"]: {
            "allow_responses": bool(u["permissions"].get("allow_responses")),
            "publish": sorted(u["permissions"]["publish"]["allow"]),
            "subscribe": sorted(u["permissions"]["subscribe"]["allow"]),
        }
        for u in users
    }


def test_helm_accounts_grant_what_the_compose_config_grants() -> None:
    conf = from_conf((ROOT / "compose" / "nats" / "nats.conf").read_text())
    conf.pop("pk-admin")  # written `publish: ">"` there; the Helm values' admin is checked below
    values = from_values(yaml.safe_load((ROOT / "deploy" / "nats" / "accounts.yaml").read_text()))
    assert values.pop("pk-admin") == {"allow_responses": False, "publish": [">"],
                                      "subscribe": [">"]}
    assert values == conf


def test_compose_mounts_the_config_and_gives_each_service_its_user() -> None:
    doc = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    nats = doc["services"]["nats"]
    assert "./nats/nats.conf:/etc/nats/nats.conf:ro" in nats["volumes"]
    assert nats["command"][:2] == ["-c", "/etc/nats/nats.conf"]
    for service in ("watcher", "allocator", "reclaimer", "gc"):
        assert doc["services"][service]["environment"]["NATS_USER"] == f"pk-{service}"
