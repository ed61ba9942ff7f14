"""Configuration and fault points: validated in one place, one sentence per bad value."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from partkeeper import config, faults
from partkeeper.config import Config, ConfigError, load
from partkeeper.faults import FaultSpecError


def test_defaults_match_the_design() -> None:
    config = load({"PK_NODE_NAME": "n1"})
    assert config.nats_urls == ("nats://127.0.0.1:4222",)
    assert config.driver == "nvml" and config.foreign_policy == "keep"
    assert str(config.kubelet_dir) == "/var/lib/kubelet/device-plugins"
    assert str(config.pods_dir) == "/var/lib/partkeeper/pods"
    assert config.resync_seconds == 10 and config.slices_per_card == 4
    assert config.room_wait_seconds is None  # the allocator's own default (30 s)


def test_values_are_read() -> None:
    config = load(
        {
            "PK_NODE_NAME": "gpu-7",
            "NATS_URL": "nats://a:1, nats://b:2",
            "PK_DRIVER": "sim",
            "PK_FOREIGN_POLICY": "reap",
            "PK_RESYNC_SECONDS": "0.5",
            "PK_METRICS_PORT": "0",
            "PK_FAULTS": "allocator.after_claim=exit",
            "PK_ROOM_WAIT_SECONDS": "12.5",
        }
    )
    assert config.room_wait_seconds == 12.5
    assert config.nats_urls == ("nats://a:1", "nats://b:2")
    assert config.node == "gpu-7" and config.driver == "sim" and config.foreign_policy == "reap"
    assert config.resync_seconds == 0.5 and config.metrics_port_for("gc") == 0


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"PK_DRIVER": "cuda"}, "PK_DRIVER='cuda' is not valid; expected one of: nvml, hgml, dmi"),
        ({"PK_FOREIGN_POLICY": "nuke"}, "PK_FOREIGN_POLICY"),
        ({"PK_RESYNC_SECONDS": "soon"}, "PK_RESYNC_SECONDS='soon' is not a number"),
        ({"PK_RESYNC_SECONDS": "0"}, "must be at least"),
        ({"PK_SLICES_PER_CARD": "-1"}, "not a whole number"),
        ({"PK_METRICS_PORT": "http"}, "PK_METRICS_PORT"),
        ({"NATS_URL": "localhost"}, "has no scheme"),
        ({"PK_ROOM_WAIT_SECONDS": "-1"}, "PK_ROOM_WAIT_SECONDS='-1' must be at least 0"),
    ],
)
def test_bad_values_say_which_and_why(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        load({"PK_NODE_NAME": "n", **env})


def test_the_reference_table_is_generated_from_the_declaration() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert config.replace_table(doc) == doc, (
        "docs/configuration.md disagrees with partkeeper/config.py; run "
        "`python -m partkeeper.config --update docs/configuration.md`")


def test_every_setting_is_declared_once_and_load_gives_its_default() -> None:
    names = [s.env for _, s in config.declared()] + [s.env for s in config.ELSEWHERE]
    assert len(names) == len(set(names))
    assert len(config.declared()) == len(dataclasses.fields(Config))
    loaded, constructed = load({"PK_NODE_NAME": "n1"}), Config(node="n1")
    assert loaded == constructed  # the dataclass and load() share one default per setting


def test_an_empty_variable_means_the_default() -> None:
    assert load({"PK_NODE_NAME": "n1", "PK_DRIVER": " ", "PK_RESYNC_SECONDS": ""}) == Config(
        node="n1")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("allocator.before_lunch=exit", "unknown fault point"),
        ("allocator.after_claim", "point=action"),
        ("allocator.after_claim=explode", "is not 'exit' or 'delay:MS'"),
        ("allocator.after_claim=delay:soon", "is not 'exit' or 'delay:MS'"),
    ],
)
def test_bad_fault_specs_are_refused(spec: str, fragment: str) -> None:
    with pytest.raises(FaultSpecError, match=fragment):
        faults.parse(spec)
    with pytest.raises(FaultSpecError):
        load({"PK_NODE_NAME": "n", "PK_FAULTS": spec})


async def test_faults_are_inert_when_unset_and_delay_when_set() -> None:
    faults.reset("")
    await faults.reach("gc.before_delete")
    faults.reset("gc.before_delete=delay:1")
    await faults.reach("gc.before_delete")
    faults.reset(None)
    with pytest.raises(FaultSpecError):
        await faults.reach("gc.not_a_point")


def test_exit_fault_ends_the_process_with_86() -> None:
    code = (
        "import asyncio; from partkeeper import faults;"
        "asyncio.run(faults.reach('reclaimer.after_destroy')); print('survived')"
    )
    env = {"PK_FAULTS": "reclaimer.after_destroy=exit", "PATH": ""}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == faults.EXIT_STATUS
    assert "survived" not in proc.stdout


def test_service_with_bad_config_exits_2_with_one_json_line() -> None:
    env = {"PK_DRIVER": "cuda", "PK_NODE_NAME": "n", "PK_METRICS_PORT": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", "from partkeeper import runtime; "
         "raise SystemExit(runtime.run('gc', None))"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    line = json.loads(lines[0])
    assert line["level"] == "error" and line["service"] == "gc"
    assert line["msg"] == ("partkeeper gc: PK_DRIVER='cuda' is not valid; expected one of: "
                           "nvml, hgml, dmi, sim")


@pytest.mark.parametrize("node", ["\u00e9" * 40, "_" * 76, "n" * 200 + "." * 20])
def test_a_node_name_that_cannot_make_durable_names_stops_with_one_sentence(node: str) -> None:
    """Every non-plain character takes three in the subject token; a token making durable names
    past nats-server's 255 characters would loop on the server's refusal instead."""
    with pytest.raises(ConfigError, match="cannot name this node on the bus") as caught:
        load({"PK_NODE_NAME": node})
    assert "\n" not in str(caught.value)


def test_the_longest_node_name_that_fits_is_accepted() -> None:
    from schemas.names import durable_name

    fits = "n" * (255 - len("watcher-events-pk_partitions-"))
    assert len(durable_name("watcher-events", fits, "PK_PARTITIONS")) == 255
    assert load({"PK_NODE_NAME": fits}).node == fits
    with pytest.raises(ConfigError):
        load({"PK_NODE_NAME": fits + "n"})


def test_the_xid_switches_are_checked_at_start() -> None:
    rules = config.load({"PK_HEALTH_IGNORE_XIDS": "48, 63", "PK_HEALTH_ENABLE_XIDS": "13"}
                        ).xid_policy()
    assert rules.ignores(48) and rules.ignores(31) and not rules.ignores(13)
    assert config.load({"PK_HEALTH_IGNORE_XIDS": "all"}).xid_policy().ignores(79)
    with pytest.raises(config.ConfigError, match="PK_HEALTH_IGNORE_XIDS"):
        config.load({"PK_HEALTH_IGNORE_XIDS": "79;48"})
