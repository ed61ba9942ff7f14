"""Harnesses for the T-Head and Hygon drivers and for the sim modelling their cards.

Each names the node it models (partition-mode cards, then sliced ones, by profiles.py model) and
the vendor's identity rule, so one contract runs on all of them with each card's own tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from partkeeper.drivers.base import Driver, Instance
from partkeeper.drivers.sim import SimDriver, init_state

from .vendor_rigs import Rig, hygon_rig, open_dmi, open_hgml, thead_rig


@dataclass
class VendorHarness:
    kind: str
    driver: Driver
    partition: list[str]  # models of the partition-mode cards, numbered from 0
    sliced: list[str]
    fresh_identity: bool  # Hygon: a new UUID on every create; else a successor reproduces it
    busy_known: bool  # whether is_busy can answer (Hygon's library cannot)
    rig: Rig | None = None

    def set_busy(self, instance: Instance, on: bool) -> None:
        if isinstance(self.driver, SimDriver):
            self.driver.set_busy(instance.uuid, on)
        else:
            assert self.rig is not None
            uuid = instance.uuid if self.kind == "hgml" else instance.uuid.removeprefix("MIG-")
            self.rig.fake.set_busy(uuid, on)

    def break_next_list(self) -> None:
        if isinstance(self.driver, SimDriver):
            self.driver.fail("list", 1)
        else:
            assert self.rig is not None
            fn = "hgmlDeviceGetGpuInstances" if self.kind == "hgml" else "nvmlDeviceGetGpuInstances"
            self.rig.fake.fail(fn, 999)


def _sim(tmp: Path, partition: list[str], sliced: list[str], fresh: bool) -> VendorHarness:
    path = tmp / "sim.json"
    init_state(path, partition, sliced)
    kind = f"sim-{partition[0].split('-')[0].lower()}"
    return VendorHarness(kind, SimDriver(path), partition, sliced, fresh, True)


def make(
    kind: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, libraries: dict[str, Path]
) -> VendorHarness:
    if kind == "sim-ppu":
        return _sim(tmp, ["PPU-96GB"], ["PPU-96GB"], fresh=False)
    if kind == "sim-dcu":
        return _sim(tmp, ["DCU-64GB", "DCU-64GB"], [], fresh=True)
    if kind == "hgml":
        rig = thead_rig(libraries["hgml"], tmp, monkeypatch, [True, False])
        driver = open_hgml(rig)
        return VendorHarness(kind, driver, ["PPU-96GB"], ["PPU-96GB"], False, True, rig)
    rig = hygon_rig(libraries["dmi"], tmp, monkeypatch, 2)
    driver = open_dmi(rig)
    return VendorHarness(kind, driver, ["DCU-64GB", "DCU-64GB"], [], True, False, rig)


KINDS = ["sim-ppu", "sim-dcu", "hgml", "dmi"]
