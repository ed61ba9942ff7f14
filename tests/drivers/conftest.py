"""Fixtures for the driver tests: one harness per driver, so the contract suite runs on both."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from partkeeper.drivers.base import Driver, Instance
from partkeeper.drivers.nvml import NvmlDriver
from partkeeper.drivers.sim import SimDriver, init_state

from .fake_pynvml import FakeNvml, standard_gpus

# The node both harnesses model: cards 0-2 in partition mode, card 3 sliced.
PARTITION_CARDS = ["H100-80GB", "A100-40GB", "H200-141GB"]
SLICED_CARDS = ["A100-40GB"]


class Harness(Protocol):
    """A driver plus the hands a test needs on its "hardware"."""

    kind: str
    driver: Driver

    def set_busy(self, instance: Instance, on: bool) -> None: ...

    def break_next_list(self) -> None: ...


@dataclass
class SimHarness:
    driver: SimDriver
    kind: str = "sim"

    def set_busy(self, instance: Instance, on: bool) -> None:
        self.driver.set_busy(instance.uuid, on)

    def break_next_list(self) -> None:
        self.driver.fail("list", 1)


@dataclass
class NvmlHarness:
    driver: NvmlDriver
    fake: FakeNvml
    kind: str = "nvml"

    def set_busy(self, instance: Instance, on: bool) -> None:
        self.fake.set_processes(instance.uuid, 1 if on else 0)

    def break_next_list(self) -> None:
        self.fake.fail("nvmlDeviceGetGpuInstances", self.fake.NVML_ERROR_UNKNOWN)


@pytest.fixture
def sim_path(tmp_path: Path) -> Path:
    path = tmp_path / "sim.json"
    init_state(path, PARTITION_CARDS, SLICED_CARDS)
    return path


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    fake = FakeNvml(standard_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    yield fake


@pytest.fixture(params=["sim", "nvml"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    if request.param == "sim":
        return SimHarness(SimDriver(request.getfixturevalue("sim_path")))
    fake: FakeNvml = request.getfixturevalue("fake_nvml")
    return NvmlHarness(NvmlDriver(), fake)
