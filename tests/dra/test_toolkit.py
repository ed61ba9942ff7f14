"""`partkeeper probe` in DRA mode says whether a workload gets NVIDIA's driver libraries: the
partition's CDI spec carries only device nodes and NVIDIA_VISIBLE_DEVICES."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from partkeeper.dra.toolkit import check

TOOLKIT_SPEC = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "all"}],
                "containerEdits": {"hooks": [{"hookName": "createContainer",
                                              "path": "/usr/bin/nvidia-cdi-hook"}]}}


def test_a_json_toolkit_spec_is_found(tmp_path: Path) -> None:
    (tmp_path / "nvidia.json").write_text(json.dumps(TOOLKIT_SPEC))
    assert check("nvml", tmp_path, tmp_path / "absent")["found"] == [str(tmp_path / "nvidia.json")]


def test_without_the_toolkit_spec_the_probe_says_what_a_workload_needs(tmp_path: Path) -> None:
    cdi, static = tmp_path / "cdi", tmp_path / "etc-cdi"
    cdi.mkdir()
    (cdi / "partkeeper.io-partition-c1.json").write_text(json.dumps(
        {"cdiVersion": "0.6.0", "kind": "partkeeper.io/partition", "devices": []}))
    (cdi / "broken.yaml").write_text("kind: [")
    found = check("nvml", cdi, static)
    assert found["needed"] and found["found"] == []
    assert "runtimeClassName: nvidia" in found["advice"] and "nvidia-ctk cdi generate" in \
        found["advice"]


def test_the_toolkit_spec_is_found_in_either_directory(tmp_path: Path) -> None:
    cdi, static = tmp_path / "cdi", tmp_path / "etc-cdi"
    cdi.mkdir()
    static.mkdir()
    (static / "nvidia.yaml").write_text('---\ncdiVersion: 0.6.0\nkind: "nvidia.com/gpu"\n')
    found = check("nvml", cdi, static)
    assert found["found"] == [str(static / "nvidia.yaml")] and found["advice"] == ""


def test_other_drivers_need_no_check(tmp_path: Path) -> None:
    assert check("hgml", tmp_path, tmp_path) == {"needed": False, "found": [], "advice": ""}


def test_probe_reports_the_section_in_dra_mode(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    cli = [sys.executable, "-m", "partkeeper"]
    subprocess.run([*cli, "sim", "init", "--state", str(state), "--cards", "H100-80GB"],
                   check=True, capture_output=True, timeout=60)
    env = {**os.environ, "PK_DRIVER": "sim", "PK_SIM_STATE": str(state), "PK_MODE": "dra",
           "PK_CDI_DIR": str(tmp_path / "cdi")}
    result = subprocess.run([*cli, "probe", "--json"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["container_runtime"]["needed"] is False
