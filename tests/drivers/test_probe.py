"""`partkeeper probe`: read-only, over the C NVML through the normal library lookup, with no
library at all, and on the sim driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
from fakes import nvml as nv
from fakes.nvml import FakeNvml

from partkeeper.drivers.base import InstanceSpec
from partkeeper.drivers.nvml import NvmlDriver

MUTATING = (
    "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy", "nvmlDeviceSetMigMode",
)  # fmt: skip


def probe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "partkeeper", "probe", *args], env={**os.environ, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_probe_over_nvml_shows_cards_profiles_and_instances_and_changes_nothing(
    fake_nvml: FakeNvml,
) -> None:
    driver = NvmlDriver()
    inst = driver.create(InstanceSpec(0, "1g.10gb", 3))
    fake_nvml.set_processes(inst.uuid, 2)
    before = {fn: fake_nvml.calls(fn) for fn in MUTATING}
    result = probe({**fake_nvml.env(), "PK_DRIVER": "nvml"}, "--json")
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    assert view["driver"] == "nvml"
    h100, a100 = view["cards"][0], view["cards"][1]
    assert (h100["model"], h100["mig"], h100["matches_tables"]) == (
        "H100-80GB", {"current": True, "pending": True}, True)
    p1 = next(p for p in a100["profiles"] if p["name"] == "1g.10gb")
    assert p1["nvml_id"] == 15
    assert p1["nvml_profile"] == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    assert p1["placements"] == [[0, 2], [2, 2], [4, 2], [6, 2]] and p1["matches"] is True
    [listed] = h100["instances"]
    assert (listed["uuid"], listed["start"], listed["processes"]) == (inst.uuid, 3, 2)
    assert view["cards"][3]["mode"] == "sliced" and view["cards"][3]["mig"]["current"] is False
    assert {fn: fake_nvml.calls(fn) for fn in MUTATING} == before  # read-only


def test_probe_reports_a_card_that_disagrees_with_the_tables(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_profile(2, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, (0,), 2)
    result = probe({**fake_nvml.env(), "PK_DRIVER": "nvml"})
    assert result.returncode == 0, result.stderr
    assert "card 2 NVIDIA H200" in result.stdout
    assert "REFUSED: H200-141GB: 7g.141gb" in result.stdout


def test_probe_without_a_library_is_one_sentence_and_a_non_zero_exit(tmp_path: Path) -> None:
    # An empty file first on the search path ends the loader's search with an error, so this
    # holds on a machine with a real libnvidia-ml.so.1 too.
    (tmp_path / "libnvidia-ml.so.1").write_bytes(b"")
    env = {"PK_DRIVER": "nvml", "LD_LIBRARY_PATH": str(tmp_path), "FAKE_NVML_STATE": ""}
    for args in ((), ("--json",)):
        result = probe(env, *args)
        assert result.returncode == 2 and result.stdout == ""
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
        assert "libnvidia-ml.so.1" in result.stderr


def test_probe_on_the_sim_driver(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    env = {"PK_DRIVER": "sim", "PK_SIM_STATE": str(state)}
    missing = probe(env, "--json")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert str(state) in missing.stderr and missing.stderr.count("\n") == 1
    cli = [sys.executable, "-m", "partkeeper", "sim"]
    subprocess.run([*cli, "init", "--state", str(state), "--cards", "A100-40GB", "--sliced",
                    "H100-80GB"], check=True, capture_output=True, timeout=60)
    subprocess.run([*cli, "carve", "--state", str(state), "--card", "0", "--profile", "3g.20gb"],
                   check=True, capture_output=True, timeout=60)
    result = probe(env, "--json")
    assert result.returncode == 0, result.stderr
    a100, sliced = json.loads(result.stdout)["cards"]
    assert a100["matches_tables"] and a100["instances"][0]["profile"] == "3g.20gb"
    assert {p["name"] for p in a100["profiles"]} >= {"1g.5gb", "7g.40gb"}
    assert sliced["mode"] == "sliced" and sliced["profiles"] == []


def test_probe_reports_a_profile_without_placements(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_placements(0, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
                             nv.ERROR_NOT_SUPPORTED)
    result = probe({**fake_nvml.env(), "PK_DRIVER": "nvml"})
    assert result.returncode == 0, result.stderr
    assert "profile 1g.10gb+me nvml id 20: 1 max, starts none (NVML: Not Supported)" in (
        result.stdout)
    assert "card 0 H100-80GB" in result.stdout and "matches the tables" in result.stdout
