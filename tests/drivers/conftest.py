"""Fixtures for the driver tests: one harness per driver kind, so the contract suite runs on each.

`harness` is parametrised over every kind in harness.py (`sim`, `nvml`, `sim-ppu`, `hgml`,
`sim-dcu`, `dmi`); a test that also takes `shape` runs once per (harness, card model, profile) of
that harness's node. `nvml` runs the real nvidia-ml-py over the fake libnvidia-ml.so.1
(tests/fakes/nvml), `hgml` and `dmi` the real drivers over their fake C libraries, all built once
per session (tests/conftest.py); a harness fails its test if the driver handed its fake library
anything the real one would reject.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.nvml import FakeNvml

from tests_support.drivers import BUILDERS, KINDS, NVIDIA_NODE, Harness, shapes, sim_state


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness" not in metafunc.fixturenames:
        return
    if "shape" in metafunc.fixturenames:
        cases = [
            pytest.param(kind, s, id=f"{kind}-{s.model}-{s.profile.name}")
            for kind in KINDS
            for s in shapes(kind)
        ]
        metafunc.parametrize(("harness", "shape"), cases, indirect=["harness"])
    else:
        metafunc.parametrize("harness", KINDS, indirect=True)


@pytest.fixture
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    built = BUILDERS[request.param](request)
    yield built
    count, last = built.hands.complaints()
    assert count == 0, f"the {built.kind} driver passed its library bad arguments: {last}"


@pytest.fixture
def sim_path(tmp_path: Path) -> Path:
    """The NVIDIA node on the sim's state file."""
    return sim_state(tmp_path / "sim.json", NVIDIA_NODE)


@pytest.fixture
def fake_nvml(nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """The NVIDIA node on the fake NVML; its capability files under tmp_path/proc."""
    fake = FakeNvml.create(nvml_library, tmp_path / "nvml.state", tmp_path / "proc")
    for model in NVIDIA_NODE.partition:
        fake.add_gpu(model)
    for model in NVIDIA_NODE.sliced:
        fake.add_gpu(model, mig=False)
    monkeypatch.setenv(fake.state_env, str(fake.state))
    return fake


@pytest.fixture
def no_complaints(fake_nvml: FakeNvml) -> Iterator[FakeNvml]:
    """Fails the test if any call handed the fake NVML what a real GPU would reject."""
    yield fake_nvml
    count, last = fake_nvml.complaints()
    assert count == 0, f"the driver passed NVML bad arguments: {last}"


@pytest.fixture
def vendor_libraries(hgml_library: Path, dmi_library: Path) -> dict[str, Path]:
    """The fake T-Head and Hygon libraries (built once per session, tests/conftest.py)."""
    return {"hgml": hgml_library, "dmi": dmi_library}
