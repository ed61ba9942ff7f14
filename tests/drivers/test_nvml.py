"""What only the nvml driver has: NVML's names and ids, undoing half-made instances, error codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from partkeeper.config import Config
from partkeeper.drivers import open_driver
from partkeeper.drivers.base import (
    InstanceSpec,
    InUseError,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
)
from partkeeper.drivers.nvml import NvmlDriver, model_for
from partkeeper.drivers.sim import SimDriver

from .fake_pynvml import FakeGpu, FakeNvml, standard_gpus

H100, A100 = 0, 1


@pytest.mark.parametrize(
    ("name", "memory_mib", "model"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40536, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", 40536, "A100-40GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA H200 NVL", 143771, "H200-141GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, None),  # not in the profile tables
        ("NVIDIA GH200 480GB", 97871, None),  # "H200" only as part of a word
        ("Tesla T4", 15360, None),
    ],
)
def test_model_names_map_to_profile_tables(name: str, memory_mib: int, model: str | None) -> None:
    assert model_for(name, memory_mib) == model


def test_profiles_match_without_nvml_names_and_never_pick_the_me_variant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml(standard_gpus(), profile_names=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    driver = NvmlDriver()
    for profile in ("1g.5gb", "1g.10gb", "2g.10gb"):
        start = {"1g.5gb": 0, "1g.10gb": 2, "2g.10gb": 4}[profile]
        inst = driver.create(InstanceSpec(A100, profile, start))
        assert fake.gpus[A100].gis[inst.gi_id].row.name == profile


def test_a_hand_carved_me_instance_is_listed_and_blocks_its_slot(fake_nvml: FakeNvml) -> None:
    driver = NvmlDriver()
    fake_nvml.add_gi(A100, "1g.5gb+me", 3)
    [listed] = driver.instances(A100)
    assert (listed.profile, listed.start, listed.size) == ("1g.5gb+me", 3, 1)
    with pytest.raises(PlacementError):
        driver.create(InstanceSpec(A100, "2g.10gb", 2))


def test_a_gpu_instance_without_compute_instance_is_listed_and_destroyable(
    fake_nvml: FakeNvml,
) -> None:
    driver = NvmlDriver()
    fake_nvml.add_gi(H100, "3g.40gb", 4, with_ci=False)
    [leftover] = driver.instances(H100)
    assert (leftover.ci_id, leftover.uuid, leftover.start) == (-1, "", 4)
    assert driver.is_busy(leftover) is False
    driver.destroy(leftover)
    assert driver.instances(H100) == []


@pytest.mark.parametrize(
    ("failing", "step"),
    [
        ("nvmlGpuInstanceCreateComputeInstance", "creating its compute instance"),
        ("nvmlDeviceGetUUID", "finding its MIG device UUID"),
    ],
)
def test_a_create_that_cannot_finish_undoes_its_gpu_instance(
    fake_nvml: FakeNvml, failing: str, step: str
) -> None:
    driver = NvmlDriver()
    driver.cards()  # reads the card UUIDs before the failure is armed
    fake_nvml.fail(failing, fake_nvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(UnknownError) as err:
        driver.create(InstanceSpec(H100, "2g.20gb", 2))
    message = str(err.value)
    assert "card 0" in message and step in message and "destroyed again" in message
    assert fake_nvml.gpus[H100].gis == {}
    assert driver.instances(H100) == []


def test_a_failed_undo_says_so_and_leaves_the_instance_listed(fake_nvml: FakeNvml) -> None:
    driver = NvmlDriver()
    fake_nvml.fail("nvmlGpuInstanceCreateComputeInstance", fake_nvml.NVML_ERROR_UNKNOWN)
    fake_nvml.fail("nvmlGpuInstanceDestroy", fake_nvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(UnknownError, match="undoing it failed too"):
        driver.create(InstanceSpec(H100, "1g.10gb", 5))
    [leftover] = driver.instances(H100)
    assert (leftover.start, leftover.ci_id, leftover.uuid) == (5, -1, "")


def test_create_refuses_when_it_cannot_read_what_exists(fake_nvml: FakeNvml) -> None:
    driver = NvmlDriver()
    fake_nvml.fail("nvmlDeviceGetMigDeviceHandleByIndex", fake_nvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(ReadError):
        driver.create(InstanceSpec(H100, "1g.10gb", 0))
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" not in fake_nvml.calls


def test_nvml_refusing_a_placement_is_a_placement_error(fake_nvml: FakeNvml) -> None:
    driver = NvmlDriver()
    fake_nvml.fail(
        "nvmlDeviceCreateGpuInstanceWithPlacement", fake_nvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    )
    with pytest.raises(PlacementError, match="Insufficient Resources"):
        driver.create(InstanceSpec(H100, "1g.10gb", 0))


@pytest.mark.parametrize(
    ("failing", "code", "error"),
    [
        ("nvmlDeviceGetGpuInstanceById", "NVML_ERROR_UNKNOWN", ReadError),
        ("nvmlDeviceGetGpuInstanceById", "NVML_ERROR_NOT_FOUND", NotFoundError),
        ("nvmlGpuInstanceGetInfo", "NVML_ERROR_NOT_FOUND", ReadError),  # a read, not an absence
        ("nvmlDeviceGetMigDeviceHandleByIndex", "NVML_ERROR_UNKNOWN", ReadError),
        ("nvmlComputeInstanceDestroy", "NVML_ERROR_IN_USE", InUseError),
        ("nvmlGpuInstanceDestroy", "NVML_ERROR_IN_USE", InUseError),
        ("nvmlGpuInstanceDestroy", "NVML_ERROR_NOT_FOUND", NotFoundError),
        ("nvmlGpuInstanceDestroy", "NVML_ERROR_UNKNOWN", UnknownError),
    ],
)
def test_destroy_maps_nvml_errors(
    fake_nvml: FakeNvml, failing: str, code: str, error: type[Exception]
) -> None:
    driver = NvmlDriver()
    inst = driver.create(InstanceSpec(H100, "4g.40gb", 0))
    fake_nvml.fail(failing, getattr(fake_nvml, code))
    with pytest.raises(error) as err:
        driver.destroy(inst)
    assert type(err.value) is error and "card 0" in str(err.value)


@pytest.mark.parametrize(
    ("failing", "code"),
    [
        ("nvmlDeviceGetGpuInstances", "NVML_ERROR_NOT_FOUND"),  # even "not found" mid-read
        ("nvmlGpuInstanceGetInfo", "NVML_ERROR_NOT_FOUND"),
        ("nvmlDeviceGetMaxMigDeviceCount", "NVML_ERROR_UNKNOWN"),
        # NOT_FOUND here is NVML's documented "no MIG device at this index", so UNKNOWN.
        ("nvmlDeviceGetMigDeviceHandleByIndex", "NVML_ERROR_UNKNOWN"),
        ("nvmlDeviceGetGpuInstanceId", "NVML_ERROR_NOT_FOUND"),
        ("nvmlDeviceGetUUID", "NVML_ERROR_NOT_FOUND"),
        ("nvmlDeviceGetMigMode", "NVML_ERROR_UNKNOWN"),
        ("nvmlDeviceGetGpuInstanceProfileInfo", "NVML_ERROR_UNKNOWN"),
    ],
)
def test_any_failure_while_listing_is_a_read_error(
    fake_nvml: FakeNvml, failing: str, code: str
) -> None:
    NvmlDriver().create(InstanceSpec(H100, "1g.10gb", 0))
    driver = NvmlDriver()  # fresh, so that its first listing also reads the static profile facts
    fake_nvml.fail(failing, getattr(fake_nvml, code))
    with pytest.raises(ReadError) as err:
        driver.instances(H100)
    assert "card 0" in str(err.value)
    fake_nvml.failures.clear()
    assert len(driver.instances(H100)) == 1


def test_cards_without_mig_are_sliced(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [FakeGpu("NVIDIA H100 80GB HBM3", 81559, "H100-80GB", mig=False)]
    gpus.append(FakeGpu("Tesla T4", 15360, None))
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus))
    driver = NvmlDriver()
    assert [(c.model, c.mode) for c in driver.cards()] == [
        ("H100-80GB", "sliced"),
        ("Tesla T4", "sliced"),
    ]
    assert driver.instances(0) == [] and driver.instances(1) == []
    with pytest.raises(PlacementError, match="MIG mode is not enabled"):
        driver.create(InstanceSpec(0, "1g.10gb", 0))


def test_nvml_that_cannot_start_is_a_read_error(fake_nvml: FakeNvml) -> None:
    fake_nvml.fail("nvmlInit", 12)  # NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(ReadError, match="initialising NVML"):
        NvmlDriver()


def test_open_driver_picks_the_configured_driver(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    sim = open_driver(Config(driver="sim", sim_state=tmp_path / "s.json"))
    assert isinstance(sim, SimDriver) and sim.path == tmp_path / "s.json"
    assert not (tmp_path / "s.json").exists()  # opening touches nothing
    assert isinstance(open_driver(Config(driver="nvml")), NvmlDriver)
    with pytest.raises(ValueError):
        open_driver(Config(driver="cuda"))  # type: ignore[arg-type]


def test_the_package_imports_without_pynvml() -> None:
    code = (
        "import sys; import partkeeper.drivers, partkeeper.drivers.nvml, partkeeper.cli;"
        "partkeeper.cli.build_parser(); assert 'pynvml' not in sys.modules, 'imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
