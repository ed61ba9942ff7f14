"""`partkeeper probe` on T-Head and Hygon nodes: the fake libraries found through the normal
library lookup, read-only, and one sentence when no library loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from partkeeper.drivers.base import InstanceSpec
from tests_support.drivers import probe
from tests_support.vendor_rigs import Rig, hygon_rig, open_dmi, open_hgml, thead_rig

MUTATING = ("CreateGpuInstanceWithPlacement", "GpuInstanceCreateComputeInstance",
            "ComputeInstanceDestroy", "GpuInstanceDestroy")


def _env(rig: Rig, driver: str) -> dict[str, str]:
    return {**rig.env(), "PK_DRIVER": driver, "PK_DRIVER_ROOT": str(rig.root),
            "PK_PROC_ROOT": str(rig.root / "proc")}


def _changes(rig: Rig, prefix: str) -> list[int]:
    return [rig.fake.calls(prefix + fn) for fn in MUTATING]


def test_probe_on_a_ppu_node_shows_hgml_ids_and_changes_nothing(
    hgml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = thead_rig(hgml_library, tmp_path, monkeypatch, [True, False])
    inst = open_hgml(rig).create(InstanceSpec(0, "4g.48gb", 4))
    before = _changes(rig, "hgml")
    result = probe(_env(rig, "hgml"), "--json")
    assert result.returncode == 0, result.stderr
    ppu, off = json.loads(result.stdout)["cards"]
    assert (ppu["model"], ppu["mode"], ppu["minor"]) == ("PPU-96GB", "partition", 1)
    offered = {p["name"]: p["nvml_id"] for p in ppu["profiles"] if p["offered"]}
    assert offered == {"4g.48gb": 5, "8g.96gb": 3}
    assert all(p["matches"] for p in ppu["profiles"] if p["offered"])
    assert [(i["uuid"], i["processes"]) for i in ppu["instances"]] == [(inst.uuid, 0)]
    assert off["mode"] == "sliced" and off["mig"]["current"] is False
    assert _changes(rig, "hgml") == before


def test_probe_on_a_dcu_node_shows_the_node_wide_mode_and_unknown_busy(
    dmi_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = hygon_rig(dmi_library, tmp_path, monkeypatch, 2)
    inst = open_dmi(rig).create(InstanceSpec(1, "2g.15gb", 2))
    before = _changes(rig, "nvml")
    result = probe(_env(rig, "dmi"))
    assert result.returncode == 0, result.stderr
    assert "card 1 DCU-64GB" in result.stdout and "unknown process(es)" in result.stdout
    view = json.loads(probe(_env(rig, "dmi"), "--json").stdout)
    dcu = view["cards"][1]
    assert dcu["mig"] == {"current": True, "pending": True, "node_wide": True}
    assert {p["name"]: (p["nvml_id"], p["nvml_profile"]) for p in dcu["profiles"]} == {
        "2g.15gb": (3, 0), "4g.31gb": (1, 1), "8g.63gb": (0, 3)}
    assert [(i["uuid"], i["processes"]) for i in dcu["instances"]] == [(inst.uuid, None)]
    assert _changes(rig, "nvml") == before


@pytest.mark.parametrize("driver", ["hgml", "dmi"])
def test_probe_without_the_library_says_so_in_one_sentence(driver: str, tmp_path: Path) -> None:
    result = probe({"PK_DRIVER": driver, "LD_LIBRARY_PATH": str(tmp_path), "PPU_HOME":
                    str(tmp_path)})
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert "no library could be opened" in result.stderr
