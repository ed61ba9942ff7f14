"""Fixtures for the driver tests: one harness per driver, so the contract suite runs on both."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from partkeeper.drivers.nvml import NvmlDriver
from partkeeper.drivers.sim import SimDriver, init_state

from .driver_harness import PARTITION_CARDS, SLICED_CARDS, Harness, NvmlHarness, SimHarness
from .fake_pynvml import FakeNvml, standard_gpus


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
