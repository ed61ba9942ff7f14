"""The reconcile pass removes what a vendor driver reports as blocking its creates (Hygon: a
directory left at a partition record's path), and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from partkeeper.drivers.base import InstanceSpec
from partkeeper_sim.driver import SimDriver, init_state
from services.reclaimer import leftovers
from tests_support.vendor_rigs import hygon_rig, open_dmi


async def test_a_squatting_directory_is_removed_and_the_create_then_succeeds(
    dmi_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = hygon_rig(dmi_library, tmp_path, monkeypatch, 1)
    driver = open_dmi(rig)
    live = driver.create(InstanceSpec(0, "2g.15gb", 3))
    ci = rig.root / "etc/dmi_mig_config/ci"
    (ci / "dev0gi2ci0.conf").mkdir()  # blocks the next GI's create
    (ci / "dev0gi9ci0.conf").mkdir()
    (ci / "dev0gi9ci0.conf/note").write_text("not empty: left for a person")
    removed = await leftovers.sweep(driver)
    assert removed == ["/etc/dmi_mig_config/ci/dev0gi2ci0.conf"]
    assert (ci / "dev0gi9ci0.conf/note").exists() and (ci / "dev0gi1ci0.conf").is_file()
    assert driver.create(InstanceSpec(0, "2g.15gb", 0)).gi_id == 2
    assert live in driver.instances(0)


async def test_drivers_without_leftovers_are_left_alone(tmp_path: Path) -> None:
    init_state(tmp_path / "sim.json", ["H100-80GB"], [])
    assert await leftovers.sweep(SimDriver(tmp_path / "sim.json")) == []
