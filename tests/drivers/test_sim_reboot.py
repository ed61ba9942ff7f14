"""`partkeeper sim reboot`: every card loses its partitions as a host reboot does; MIG mode, the
cards' UUIDs, their health and the injected faults are kept (docs/contract.md section 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from partkeeper import bootid
from partkeeper.cli import main
from partkeeper.drivers import InstanceSpec
from partkeeper_sim.driver import SimDriver, init_state


def test_a_reboot_removes_every_partition_and_keeps_the_cards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "sim.json"
    init_state(state, ["H100-80GB", "A100-40GB"], ["H200-141GB"])
    sim = SimDriver(state)
    made = sim.create(InstanceSpec(0, "1g.10gb", 0))
    sim.set_busy(made.uuid, True)  # a process holds it: a reboot ends it all the same
    sim.carve(1, "3g.20gb", 4)  # by hand: gone too
    sim.fail_card(1, 48)
    sim.fail("create", 2)
    before = sim.list()

    assert main(["sim", "reboot", "--state", str(state), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"removed": {"0": [made.uuid], "1": [before["cards"][1]["instances"][0]["uuid"]],
                               "2": []}}
    after = sim.list()
    for old, new in zip(before["cards"], after["cards"], strict=True):
        assert new["instances"] == []
        assert {k: new[k] for k in ("index", "uuid", "model", "mode", "health", "xids")} == \
            {k: old[k] for k in ("index", "uuid", "model", "mode", "health", "xids")}
    assert after["faults"] == before["faults"]
    # Again: nothing left to remove, nothing else changes.
    assert main(["sim", "reboot", "--state", str(state)]) == 0
    assert "0 partitions removed from 3 cards" in capsys.readouterr().out


def test_a_missing_state_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "reboot", "--state", str(tmp_path / "none.json")]) != 0
    assert capsys.readouterr().err.strip()
    assert not (tmp_path / "none.json").exists()


def test_the_boot_id_is_read_under_the_proc_root(tmp_path: Path) -> None:
    with pytest.raises(bootid.BootIdError, match="boot_id"):
        bootid.read(tmp_path)  # missing: an error, never "a new boot"
    bootid.write(tmp_path, "7A1E2C3D-4B5F-4E6A-8B9C-0D1E2F3A4B5C")
    assert bootid.path(tmp_path).read_text() == "7a1e2c3d-4b5f-4e6a-8b9c-0d1e2f3a4b5c\n"
    assert bootid.read(tmp_path) == "7a1e2c3d-4b5f-4e6a-8b9c-0d1e2f3a4b5c"
    for bad in ("", "not-a-uuid\n", "7a1e2c3d4b5f4e6a8b9c0d1e2f3a4b5c\n"):
        bootid.path(tmp_path).write_text(bad)
        with pytest.raises(bootid.BootIdError, match="not a boot id"):
            bootid.read(tmp_path)
    with pytest.raises(bootid.BootIdError):
        bootid.write(tmp_path, "nope")
