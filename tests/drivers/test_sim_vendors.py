"""The sim modelling T-Head PPU and Hygon DCU cards: `sim init --cards PPU-...,DCU-...`, each
vendor's identity rule, and each vendor's container rules (without device nodes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from partkeeper.cli import main
from partkeeper.drivers.base import InstanceSpec, PlacementError
from partkeeper_sim.driver import SimDriver, init_state


def test_sim_init_models_ppu_and_dcu_cards(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    state = tmp_path / "sim.json"
    assert main(["sim", "init", "--state", str(state), "--cards", "PPU-96GB,DCU-64GB",
                 "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert [(c["model"], c["memory_mib"]) for c in view["cards"]] == [
        ("PPU-96GB", 98304), ("DCU-64GB", 65520)]
    assert main(["sim", "carve", "--state", str(state), "--card", "1", "--profile", "4g.31gb",
                 "--start", "2", "--json"]) == 0
    carved = json.loads(capsys.readouterr().out)
    assert (carved["start"], carved["size"]) == (2, 2)
    assert main(["sim", "carve", "--state", str(state), "--card", "1", "--profile", "4g.31gb",
                 "--start", "1"]) == 2  # not a legal placement on a DCU
    assert "not a legal placement" in capsys.readouterr().err


def test_each_vendor_keeps_its_identity_rule(tmp_path: Path) -> None:
    init_state(tmp_path / "sim.json", ["PPU-96GB", "DCU-64GB"], [])
    sim = SimDriver(tmp_path / "sim.json")
    for card, profile, reproduced in ((0, "4g.48gb", True), (1, "2g.15gb", False)):
        first = sim.create(InstanceSpec(card, profile, 0))
        sim.destroy(first)
        successor = sim.create(InstanceSpec(card, profile, 0))
        assert (successor.uuid == first.uuid) is reproduced, profile


def test_container_rules_per_vendor(tmp_path: Path) -> None:
    init_state(tmp_path / "sim.json", ["H100-80GB", "PPU-96GB", "DCU-64GB"], [])
    sim = SimDriver(tmp_path / "sim.json")
    mig = [sim.create(InstanceSpec(0, "1g.10gb", s)) for s in (0, 1)]
    assert sim.container_edits(mig).env == {
        "NVIDIA_VISIBLE_DEVICES": f"{mig[0].uuid},{mig[1].uuid}"}
    ppu = [sim.create(InstanceSpec(1, "4g.48gb", s)) for s in (0, 4)]
    assert sim.container_edits(ppu[:1]).env == {}
    dcu = sim.create(InstanceSpec(2, "2g.15gb", 0))
    assert sim.container_edits([dcu]).env == {"DMI_MIG_VISIBLE_DEVICE": dcu.uuid}
    with pytest.raises(PlacementError, match="exactly one partition"):
        sim.container_edits(ppu)
