"""`partkeeper sim ...`: the --json shapes of docs/contract.md section 6; bad input changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from partkeeper.cli import main

CARDS = ["--cards", "H100-80GB,A100-40GB", "--sliced", "H200-141GB"]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["sim", *args])
    out, err = capsys.readouterr()
    return status, out, err


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    status, out, err = _run(capsys, *args, "--json")
    assert status == 0, err
    return json.loads(out)


def _assert_list_shape(view: dict[str, Any]) -> None:
    for card in view["cards"]:
        assert isinstance(card["index"], int) and isinstance(card["uuid"], str)
        assert isinstance(card["model"], str) and card["mode"] in ("partition", "sliced")
        for inst in card["instances"]:
            for key in ("gi_id", "ci_id", "start", "size"):
                assert type(inst[key]) is int, key
            for key in ("uuid", "profile"):
                assert isinstance(inst[key], str), key
            assert type(inst["busy"]) is bool


@pytest.fixture
def state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "state" / "sim.json"  # init creates the directory
    assert _run(capsys, "init", *CARDS, "--state", str(path))[0] == 0
    return path


def test_json_shapes(capsys: pytest.CaptureFixture[str], state: Path) -> None:
    s = ("--state", str(state))
    view = _json(capsys, "list", *s)
    _assert_list_shape(view)
    assert [(c["index"], c["model"], c["mode"]) for c in view["cards"]] == [
        (0, "H100-80GB", "partition"),
        (1, "A100-40GB", "partition"),
        (2, "H200-141GB", "sliced"),
    ]
    carved = _json(capsys, "carve", "--card", "1", "--profile", "3g.20gb", *s)
    assert carved == {
        "card": 1, "gi_id": 1, "ci_id": 0, "uuid": carved["uuid"], "profile": "3g.20gb",
        "start": 0, "size": 4,
    }  # fmt: skip
    assert _json(capsys, "carve", "--card", "1", "--profile", "3g.20gb", *s)["start"] == 4
    busy = _json(capsys, "busy", "--uuid", carved["uuid"], "--on", *s)
    assert busy["busy"] is True and busy["uuid"] == carved["uuid"]
    assert _json(capsys, "fail", "--op", "destroy", "--times", "2", "--error", "in_use", *s) == {
        "op": "destroy", "times": 2, "error": "in_use",
    }  # fmt: skip
    latency = _json(capsys, "latency", "--op", "create", "--ms", "40", *s)
    assert latency == {"op": "create", "ms": 40}
    view = _json(capsys, "list", *s)
    _assert_list_shape(view)
    [first, second] = view["cards"][1]["instances"]
    assert (first["uuid"], first["busy"], second["busy"]) == (carved["uuid"], True, False)
    assert view["faults"]["destroy"] == {"times": 2, "error": "in_use"}
    assert view["latency_ms"]["create"] == 40


def test_human_output_is_a_table(capsys: pytest.CaptureFixture[str], state: Path) -> None:
    _carve(state, "1g.10gb", "6")
    status, out, _ = _run(capsys, "list", "--state", str(state))
    assert status == 0
    assert "H100-80GB" in out and "1g.10gb" in out and "carved" in out and "MIG-" in out


def _carve(path: Path, profile: str, start: str) -> None:
    assert main(["sim", "carve", "--card", "0", "--profile", profile, "--start", start,
                 "--state", str(path)]) == 0  # fmt: skip


BAD_INPUT: list[tuple[str, Callable[[Path], None] | None, list[str], str]] = [
    ("unknown model", None, ["init", "--cards", "H100-80GB,X100", "--force"], "unknown card model"),
    ("unknown sliced", None, ["init", "--cards", "A100-40GB", "--sliced", "Z", "--force"], "'Z'"),
    ("no cards", None, ["init", "--cards", ",", "--force"], "at least one card"),
    ("no --force", None, ["init", *CARDS], "already exists; pass --force"),
    ("overlap", lambda p: _carve(p, "2g.20gb", "0"),
     ["carve", "--card", "0", "--profile", "1g.10gb", "--start", "1"], "overlap"),
    ("illegal start", None, ["carve", "--card", "0", "--profile", "3g.40gb", "--start", "2"],
     "not a legal placement"),
    ("unknown profile", None, ["carve", "--card", "0", "--profile", "9g.1gb"], "no profile"),
    ("no such card", None, ["carve", "--card", "9", "--profile", "1g.10gb"], "no such card"),
    ("sliced card", None, ["carve", "--card", "2", "--profile", "1g.18gb"], "sliced mode"),
    ("card full", lambda p: _carve(p, "7g.80gb", "0"),
     ["carve", "--card", "0", "--profile", "1g.10gb"], "no free placement"),
    ("unknown uuid", None, ["busy", "--uuid", "MIG-nope", "--on"], "no instance has this UUID"),
    ("negative times", None, ["fail", "--op", "create", "--times", "-1"], "cannot inject"),
    ("negative ms", None, ["latency", "--op", "destroy", "--ms", "-5"], "cannot set latency"),
    ("list halfway", None, ["fail", "--op", "list", "--times", "1", "--error", "halfway"],
     "only create and destroy have two steps"),
    ("busy without uuid", None, ["busy", "--uuid", "", "--on"], "no instance has this UUID"),
]  # fmt: skip


def _assert_one_sentence(err: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith("."), err


@pytest.mark.parametrize(
    ("setup", "args", "fragment"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
)
def test_bad_input_exits_2_with_one_sentence_and_changes_nothing(
    capsys: pytest.CaptureFixture[str],
    state: Path,
    setup: Callable[[Path], None] | None,
    args: list[str],
    fragment: str,
) -> None:
    if setup:
        setup(state)
    capsys.readouterr()
    before = state.read_bytes()
    status, out, err = _run(capsys, *args, "--state", str(state))
    assert (status, out) == (2, "")
    _assert_one_sentence(err)
    assert fragment in err
    assert state.read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["carve", "--card", "0", "--profile", "1g.10gb"],
        ["busy", "--uuid", "MIG-x", "--off"],
        ["fail", "--op", "list", "--times", "1"],
        ["latency", "--op", "create", "--ms", "1"],
    ],
)
def test_corrupt_or_missing_state_is_named_and_left_alone(
    capsys: pytest.CaptureFixture[str], state: Path, args: list[str]
) -> None:
    corrupt = b'{"version": 1, "cards": [{"index": 0'
    state.write_bytes(corrupt)
    status, _, err = _run(capsys, *args, "--state", str(state))
    assert status == 2 and str(state) in err and "corrupt" in err
    _assert_one_sentence(err)
    assert state.read_bytes() == corrupt

    missing = state.with_name("missing.json")
    status, _, err = _run(capsys, *args, "--state", str(missing))
    assert status == 2 and str(missing) in err and "does not exist" in err
    _assert_one_sentence(err)
    assert not missing.exists()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "partkeeper", "sim", *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_as_a_command_with_the_state_from_pk_sim_state(tmp_path: Path) -> None:
    env = {**os.environ, "PK_SIM_STATE": str(tmp_path / "sim.json")}
    env.pop("PK_FAULTS", None)
    assert _cli(env, "--help").returncode == 0
    assert _cli(env, "init", "--cards", "H100-80GB").returncode == 0
    assert (tmp_path / "sim.json").exists()
    carved = json.loads(_cli(env, "carve", "--card", "0", "--profile", "4g.40gb", "--json").stdout)
    view = json.loads(_cli(env, "list", "--json").stdout)
    _assert_list_shape(view)
    assert [i["uuid"] for i in view["cards"][0]["instances"]] == [carved["uuid"]]

    before = (tmp_path / "sim.json").read_bytes()
    refused = _cli(env, "carve", "--card", "0", "--profile", "3g.40gb", "--start", "0")
    assert refused.returncode == 2 and refused.stdout == ""
    _assert_one_sentence(refused.stderr)
    assert (tmp_path / "sim.json").read_bytes() == before
