"""The `dmi` driver on the fake libhydmi_mig.so.1: what is Hygon's own beyond the contract."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fakes import dmi as fake_dmi
from fakes import nvml as fake_nvml

from partkeeper.drivers.base import (
    InstanceSpec,
    LibraryMissing,
    PlacementError,
    ReadError,
    UnknownError,
)
from partkeeper.drivers.hygon import api as dmi_api
from partkeeper.drivers.hygon.binding import DmiDriver
from tests_support.vendor_rigs import Rig, hygon_rig, open_dmi

ERROR_UNKNOWN = 999


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor_libraries: dict[str, Path]):
    rig = hygon_rig(vendor_libraries["dmi"], tmp_path, monkeypatch, 2)
    yield rig
    count, last = rig.fake.complaints()
    assert count == 0, f"the driver passed DMI what the library rejects: {last}"


def _address(fn: Any) -> int:  # a ctypes function pointer, typed as `clib` types them
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def test_every_symbol_resolves_to_dmi_beside_nvml_in_the_global_scope(
    rig: Rig, nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DMI exports NVML's names. With the (fake) NVML loaded RTLD_GLOBAL, the worst case, every
    function the binding declares is DMI's own, and NVML keeps answering as NVML."""
    nvml = fake_nvml.FakeNvml.create(nvml_library, tmp_path / "nvml.state")
    for model in ("H100-80GB", "H100-80GB", "A100-40GB"):
        nvml.add_gpu(model)
    monkeypatch.setenv(nvml.state_env, str(nvml.state))
    nvidia = ctypes.CDLL(str(nvml_library), mode=os.RTLD_GLOBAL)
    process = ctypes.CDLL(None)  # the global scope, where a plain lookup would land

    api = dmi_api.load([str(rig.fake.library)])
    own = ctypes.CDLL(str(rig.fake.library), mode=os.RTLD_LOCAL)
    shared = [name for name in api.fn if hasattr(nvidia, name)]
    assert len(shared) >= 10  # the names really do collide
    for name, fn in api.fn.items():
        assert _address(fn) == _address(getattr(own, name)), name
    for name in shared:
        assert _address(api.fn[name]) != _address(getattr(nvidia, name)), name
        assert _address(getattr(process, name)) == _address(getattr(nvidia, name)), name

    assert len(open_dmi(rig).cards()) == 2  # DMI's cards, not NVML's three
    import pynvml

    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == 3
    finally:
        pynvml.nvmlShutdown()


def test_cards_are_addressed_by_their_registry_pci_bus_id(rig: Rig) -> None:
    driver = open_dmi(rig)
    assert [c.uuid for c in driver.cards()] == ["GPU-000000005a3c11d0", "GPU-000000005a3c11d1"]
    assert rig.fake.calls("nvmlDeviceGetHandleByPciBusId") >= 2
    (rig.root / "etc/dmi_mig_config/dev1").write_text("19:00.0\n")  # the short form
    with pytest.raises(ReadError, match="not a domain-qualified PCI bus id"):
        driver.cards()
    (rig.root / "etc/dmi_mig_config/dev1").unlink()
    with pytest.raises(ReadError, match="dev1"):
        driver.cards()


def test_node_wide_mode_off_lists_every_card_sliced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor_libraries: dict[str, Path]
) -> None:
    rig = hygon_rig(vendor_libraries["dmi"], tmp_path, monkeypatch, 2, mig=False)
    driver = open_dmi(rig)
    assert [c.mode for c in driver.cards()] == ["sliced", "sliced"]
    assert driver.instances(0) == []
    with pytest.raises(PlacementError, match="MIG mode is not enabled"):
        driver.create(InstanceSpec(0, "2g.15gb", 0))


def test_identity_is_the_registry_record_issued_afresh(rig: Rig) -> None:
    driver = open_dmi(rig)
    inst = driver.create(InstanceSpec(1, "2g.15gb", 3))
    record = rig.root / "etc/dmi_mig_config/ci/dev1gi1ci0.conf"
    assert f"mig_uuid: {inst.uuid.removeprefix('MIG-')}" in record.read_text()
    driver.destroy(inst)
    assert not record.exists()
    assert driver.create(InstanceSpec(1, "2g.15gb", 3)).uuid != inst.uuid


def test_a_directory_at_a_record_path_is_reported_and_removed(rig: Rig) -> None:
    driver = open_dmi(rig)
    squat = rig.root / "etc/dmi_mig_config/ci/dev0gi1ci0.conf"
    squat.mkdir()
    assert driver.leftovers() == ["/etc/dmi_mig_config/ci/dev0gi1ci0.conf"]
    with pytest.raises(UnknownError, match="a directory sits at the partition record"):
        driver.create(InstanceSpec(0, "4g.31gb", 0))
    assert rig.fake.count(0, "gi") == 0  # the half-made GPU instance was undone
    driver.remove_leftover(driver.leftovers()[0])
    assert not squat.exists() and driver.leftovers() == []
    assert driver.create(InstanceSpec(0, "4g.31gb", 0)).gi_id == 1


def test_remove_leftover_touches_nothing_but_an_empty_directory_at_a_record(rig: Rig) -> None:
    driver = open_dmi(rig)
    ci = rig.root / "etc/dmi_mig_config/ci"
    (ci / "dev0gi2ci0.conf").mkdir()
    (ci / "dev0gi2ci0.conf" / "something").write_text("kept")
    inst = driver.create(InstanceSpec(0, "2g.15gb", 0))
    with pytest.raises(OSError):
        driver.remove_leftover("/etc/dmi_mig_config/ci/dev0gi2ci0.conf")  # not empty
    with pytest.raises(ValueError, match="not a directory"):
        driver.remove_leftover("/etc/dmi_mig_config/ci/dev0gi1ci0.conf")  # a live record
    with pytest.raises(ValueError, match="not a record path"):
        driver.remove_leftover("/etc/passwd")
    assert driver.instances(0) == [inst] and (ci / "dev0gi2ci0.conf/something").exists()


def test_container_gets_nodes_runtime_record_and_env(rig: Rig) -> None:
    rig.require_nodes()
    driver = open_dmi(rig)
    inst = driver.create(InstanceSpec(1, "4g.31gb", 2))
    edits = driver.container_edits([inst])
    assert edits.env == {"DMI_MIG_VISIBLE_DEVICE": inst.uuid}
    assert [d.container_path for d in edits.devices] == [
        "/dev/kfd", "/dev/mkfd", "/dev/dri/card2", "/dev/dri/renderD129"]
    assert [(m.container_path, m.read_only) for m in edits.mounts] == [
        ("/opt/hyhal", True), ("/etc/dmi_mig_config/ci/dev1gi1ci0.conf", True)]
    assert edits.mounts[1].host_path == str(rig.root / "etc/dmi_mig_config/ci/dev1gi1ci0.conf")


def test_a_missing_record_is_never_handed_to_a_container(rig: Rig) -> None:
    rig.require_nodes()
    driver = open_dmi(rig)
    inst = driver.create(InstanceSpec(0, "8g.63gb", 0))
    (rig.root / "etc/dmi_mig_config/ci/dev0gi1ci0.conf").unlink()
    with pytest.raises(ReadError, match="is not a file"):
        driver.container_edits([inst])
    with pytest.raises(ReadError, match="cannot read the partition record"):
        driver.instances(0)  # fails closed, never lists the partition without its identity


def test_no_library_is_one_start_up_sentence(tmp_path: Path) -> None:
    with pytest.raises(LibraryMissing, match="Hygon DMI: no library could be opened"):
        DmiDriver(paths=[str(tmp_path / "libhydmi_mig.so.1")])
    assert dmi_api.candidates()[:2] == ["libhydmi_mig.so.1", "libhydmi_mig.so"]
    assert "/opt/hyhal/lib/libhydmi_mig.so.1" in dmi_api.candidates()


def test_fake_refuses_the_short_pci_form(rig: Rig) -> None:
    """The fact the driver is built on: the library takes only the domain-qualified form."""
    lib = ctypes.CDLL(str(rig.fake.library), mode=os.RTLD_LOCAL)
    handle = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByPciBusId(b"09:00.0", ctypes.byref(handle)) == 2
    assert lib.nvmlDeviceGetHandleByPciBusId(fake_dmi.pci(0).encode(), ctypes.byref(handle)) == 0


def test_the_library_adds_nothing_to_the_global_scope(rig: Rig) -> None:
    """Opened RTLD_LOCAL: a library loaded after it (libnvidia-ml, for pynvml) can never have its
    own NVML names bound to DMI's functions."""
    probe = (
        "import ctypes, sys\n"
        "from partkeeper.drivers.hygon import api as dmi_api\n"
        f"api = dmi_api.load([{str(rig.fake.library)!r}])\n"
        "sys.exit(0 if not hasattr(ctypes.CDLL(None), 'nvmlDeviceGetCount') else 3)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **rig.env()},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
