"""deploy/nats/*.yaml render to a configuration nats-server accepts.

Helm cannot run here, so `chart_config` does what the NATS chart (1.x) does with these values:
its config templates build a base document from `config.*` (files/config/config.yaml, cluster.yaml,
jetstream.yaml), `config.merge` is merged over it (mergeOverwrite: maps merged, the rest
replaced), the result is written as JSON (toPrettyRawJson), and every string `"<< X >>"` is
unquoted to `X` (nats.formatConfig). Values files given with several `-f` are merged first, as
Helm merges them. `nats-server -t` then parses the file as the servers would.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from partkeeper_sim.stack.natsserver import binary

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "deploy" / "nats" / "values.yaml"
ACCOUNTS = ROOT / "deploy" / "nats" / "accounts.yaml"
RELEASE = "nats"  # `helm install nats nats/nats`: statefulSet and service names follow


def merge(base: Any, over: Any) -> Any:
    """Helm's values merge and sprig's mergeOverwrite: maps recursively, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


def chart_config(values: dict[str, Any]) -> str:
    config = values["config"]
    doc: dict[str, Any] = {
        "server_name": "<< $POD_NAME >>",
        "lame_duck_grace_period": "10s",
        "lame_duck_duration": "30s",
        "pid_file": "/var/run/nats/nats.pid",  # the reloader is on by default
        "port": config.get("nats", {}).get("port", 4222),
    }
    cluster = config.get("cluster", {})
    if cluster.get("enabled"):
        doc["cluster"] = merge({
            "name": RELEASE, "port": cluster.get("port", 6222), "no_advertise": True,
            "routes": [f"nats://{RELEASE}-{i}.{RELEASE}-headless:6222"
                       for i in range(int(cluster.get("replicas", 3)))],
        }, cluster.get("merge", {}))
    if config.get("monitor", {}).get("enabled", True):
        doc["http_port"] = config.get("monitor", {}).get("port", 8222)
    js = config.get("jetstream", {})
    if js.get("enabled"):
        section: dict[str, Any] = {}
        memory, files = js.get("memoryStore", {}), js.get("fileStore", {})
        if memory.get("enabled"):
            if memory.get("maxSize"):
                section["max_memory_store"] = f"<< {memory['maxSize']} >>"
        else:
            section["max_memory_store"] = 0
        if files.get("enabled", True):
            section["store_dir"] = files.get("dir", "/data")
            if files.get("maxSize"):
                section["max_file_store"] = f"<< {files['maxSize']} >>"
        else:
            section["max_file_store"] = 0
        doc["jetstream"] = merge(section, js.get("merge", {}))
    doc = merge(doc, config.get("merge", {}))
    text = json.dumps(doc, indent=2)
    text = re.sub(r'".*\$include": "(.*)",?', r"include \1;", text)
    return re.sub(r'"<<\s+(.*)\s+>>"', r"\1", text)


def values_from(*files: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for path in files:
        doc = merge(doc, yaml.safe_load(path.read_text()))
    return doc


def check(config: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "nats.conf"
    path.write_text(config)
    env = {**os.environ, "POD_NAME": "nats-0"}
    env.update({f"PK_{who}_PASSWORD": f"{who.lower()}-secret"
                for who in ("ADMIN", "WATCHER", "ALLOCATOR", "RECLAIMER", "GC", "PROVISION")})
    return subprocess.run([binary(), "-t", "-c", str(path)], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.mark.parametrize("files", [(VALUES,), (VALUES, ACCOUNTS)], ids=["values", "accounts"])
def test_the_rendered_configuration_is_accepted(files: tuple[Path, ...], tmp_path: Path) -> None:
    result = check(chart_config(values_from(*files)), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_unit_outside_the_chart_convention_is_refused(tmp_path: Path) -> None:
    """What the values said before: the checker must see the chart's JSON the server sees."""
    values = values_from(VALUES)
    values["config"]["merge"]["max_payload"] = "1MB"
    result = check(chart_config(values), tmp_path)
    assert result.returncode != 0
    assert "is string, not int64" in result.stderr  # the refusal the issue reported


def test_three_servers_and_three_replicas_of_every_stream_and_bucket() -> None:
    values = values_from(VALUES)
    assert values["config"]["cluster"] == {**values["config"]["cluster"], "enabled": True,
                                           "replicas": 3}
    assert values["config"]["jetstream"]["fileStore"]["pvc"]["enabled"] is True
    base = yaml.safe_load((ROOT / "deploy" / "base" / "kustomization.yaml").read_text())
    (literals,) = [g["literals"] for g in base["configMapGenerator"] if g["name"] == "partkeeper"]
    assert "PK_STREAM_REPLICAS=3" in literals


def test_operators_have_an_admin_user() -> None:
    values = values_from(VALUES, ACCOUNTS)
    users = {u["user"]: u for u in values["config"]["merge"]["accounts"]["PARTKEEPER"]["users"]}
    admin = users["pk-admin"]["permissions"]
    assert admin == {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    assert users["pk-admin"]["password"] == "<< $PK_ADMIN_PASSWORD >>"
    env = values["container"]["env"]["PK_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert env == {"name": "partkeeper-nats-passwords", "key": "admin"}
