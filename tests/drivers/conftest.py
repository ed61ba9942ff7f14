"""Fixtures for the driver tests: one harness per driver, so the contract suite runs on each.

`nvml` runs the real nvidia-ml-py over the fake libnvidia-ml.so.1 (tests/fakes/nvml), built once
per session against nvidia-nvml-dev's nvml.h (`nvml_library`, tests/conftest.py). A driver added
later adds a harness (driver_harness.py) and an entry in `HARNESSES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakes.nvml import FakeNvml

from partkeeper.drivers.sim import SimDriver, init_state

from .driver_harness import PARTITION_CARDS, SLICED_CARDS, Harness, NvmlHarness, SimHarness


@pytest.fixture
def sim_path(tmp_path: Path) -> Path:
    path = tmp_path / "sim.json"
    init_state(path, PARTITION_CARDS, SLICED_CARDS)
    return path


@pytest.fixture
def fake_nvml(nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """The standard node on the fake NVML; its capability files under tmp_path/proc."""
    fake = FakeNvml.create(nvml_library, tmp_path / "nvml.state", tmp_path / "proc")
    for model in PARTITION_CARDS:
        fake.add_gpu(model)
    for model in SLICED_CARDS:
        fake.add_gpu(model, mig=False)
    monkeypatch.setenv(fake.state_env, str(fake.state))
    return fake


@pytest.fixture
def no_complaints(fake_nvml: FakeNvml) -> Iterator[FakeNvml]:
    """Fails the test if any call handed the fake NVML what a real GPU would reject."""
    yield fake_nvml
    count, last = fake_nvml.complaints()
    assert count == 0, f"the driver passed NVML bad arguments: {last}"


def _sim(request: pytest.FixtureRequest) -> Harness:
    return SimHarness(SimDriver(request.getfixturevalue("sim_path")))


def _nvml(request: pytest.FixtureRequest) -> Harness:
    from partkeeper.drivers.nvml import NvmlDriver

    fake: FakeNvml = request.getfixturevalue("no_complaints")
    return NvmlHarness(NvmlDriver(), fake)


HARNESSES: dict[str, Callable[[pytest.FixtureRequest], Harness]] = {"sim": _sim, "nvml": _nvml}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest) -> Harness:
    return HARNESSES[request.param](request)


@pytest.fixture
def vendor_libraries(hgml_library: Path, dmi_library: Path) -> dict[str, Path]:
    """The fake T-Head and Hygon libraries (built once per session, tests/conftest.py)."""
    return {"hgml": hgml_library, "dmi": dmi_library}
