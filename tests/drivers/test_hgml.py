"""The `hgml` driver on the fake libhgml.so: what is T-Head's own beyond the shared contract."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest
from fakes import hgml as fake_hgml

from partkeeper.drivers.base import InstanceSpec, LibraryMissing, ReadError, UnknownError
from partkeeper.drivers.thead import api as hgml_api
from partkeeper.drivers.thead.binding import HgmlDriver
from tests_support.vendor_rigs import Rig, open_hgml, thead_rig

ERROR_UNKNOWN = 999


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor_libraries: dict[str, Path]):
    rig = thead_rig(vendor_libraries["hgml"], tmp_path, monkeypatch, [True])
    yield rig
    count, last = rig.fake.complaints()
    assert count == 0, f"the driver passed HGML what the library rejects: {last}"


def _offered(driver: HgmlDriver) -> dict[str, int]:
    info = driver.catalogue("test", 0, driver.binding.device("test", 0))
    return {p.name: p.id for p in info.profiles if p.offered}


def test_profiles_are_probed_by_index_and_matched_by_normalised_name(rig: Rig) -> None:
    driver = open_hgml(rig)
    # "MIG 4g48gb" at index 1 is id 5, "MIG 8g96gb" at index 4 is id 3; the alias at index 6 and
    # the +gfx variant are not offered.
    assert _offered(driver) == {"4g.48gb": 5, "8g.96gb": 3}
    assert rig.fake.calls("hgmlDeviceGetGpuInstanceProfileInfoV") >= hgml_api.PROFILE_PROBES


def test_the_gfx_capability_bit_withholds_a_profile_only_when_v2_and_v3_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor_libraries: dict[str, Path]
) -> None:
    gfx = [(1, 5, 4, 4, 2, 49152, fake_hgml.CAPS_GFX, "MIG 4g48gb"),
           (4, 3, 8, 8, 1, 98304, 0, "MIG 8g96gb")]
    rig = thead_rig(vendor_libraries["hgml"], tmp_path, monkeypatch, [])
    rig.fake.add_ppu(profiles=gfx)
    assert _offered(open_hgml(rig)) == {"8g.96gb": 3}
    # A library filling the v3 buffer with the v2 layout disagrees with its own v2 read: its
    # capability bits are ignored rather than read from the wrong offset.
    rig.fake.quirk("v3_as_v2")
    assert _offered(open_hgml(rig)) == {"4g.48gb": 5, "8g.96gb": 3}


def test_the_library_is_found_under_ppu_home(tmp_path: Path) -> None:
    env = {"PPU_HOME": str(tmp_path)}
    assert hgml_api.candidates(env) == [
        "libhgml.so", f"{tmp_path}/lib64/libhgml.so", f"{tmp_path}/lib/libhgml.so"]
    assert hgml_api.candidates({})[1] == "/usr/local/PPU_SDK/lib64/libhgml.so"


def test_no_library_or_a_failed_init_is_one_start_up_sentence(rig: Rig, tmp_path: Path) -> None:
    with pytest.raises(LibraryMissing, match="T-Head HGML: no library could be opened"):
        HgmlDriver(root=rig.root, paths=[str(tmp_path / "nowhere/libhgml.so")])
    rig.fake.fail("hgmlInit_v2", ERROR_UNKNOWN)
    with pytest.raises(LibraryMissing, match="cannot be initialised"):
        open_hgml(rig)


def test_a_failed_compute_instance_create_undoes_the_gpu_instance(rig: Rig) -> None:
    driver = open_hgml(rig)
    rig.fake.fail("hgmlGpuInstanceCreateComputeInstance", ERROR_UNKNOWN)
    with pytest.raises(UnknownError, match=r"compute instance failed.*destroyed again"):
        driver.create(InstanceSpec(0, "4g.48gb", 0))
    assert rig.fake.count(0, "gi") == 0 and driver.instances(0) == []


def test_a_destroy_stopped_between_ci_and_gi_is_finished_by_the_next_one(rig: Rig) -> None:
    driver = open_hgml(rig)
    inst = driver.create(InstanceSpec(0, "8g.96gb", 0))
    rig.fake.fail("hgmlGpuInstanceDestroy", ERROR_UNKNOWN)
    with pytest.raises(UnknownError):
        driver.destroy(inst)
    (left,) = driver.instances(0)
    assert (left.gi_id, left.ci_id, left.uuid) == (inst.gi_id, -1, "")
    driver.destroy(inst)  # no UUID left to compare: GI id, profile and start decide
    assert driver.instances(0) == []


def test_container_gets_the_ppu_and_capability_nodes(rig: Rig) -> None:
    rig.require_nodes()
    driver = open_hgml(rig)
    inst = driver.create(InstanceSpec(0, "4g.48gb", 4))
    edits = driver.container_edits([inst])
    paths = [d.container_path for d in edits.devices]
    caps = sorted(int(p.rsplit("cap", 1)[1]) for p in paths[3:])
    assert paths[:3] == ["/dev/alixpu", "/dev/alixpu_ctl", "/dev/alixpu_ppu0"]
    assert len(caps) == 2 and caps[1] == caps[0] + 1  # the GI's, then its CI's
    assert edits.env == {} and edits.mounts == ()
    assert all(Path(d.host_path).is_relative_to(rig.root) for d in edits.devices)


def test_a_ppu_node_with_another_minor_is_refused(rig: Rig) -> None:
    rig.require_nodes()
    driver = open_hgml(rig)
    inst = driver.create(InstanceSpec(0, "4g.48gb", 0))
    node = rig.root / "dev/alixpu_ppu0"
    node.unlink()
    os.mknod(node, 0o20666, os.makedev(510, 2))  # the next PPU's minor
    with pytest.raises(ReadError, match="has minor 2, but the card reports 1"):
        driver.container_edits([inst])


def test_a_whole_ppu_is_handed_over_only_through_a_node_of_its_own_minor(rig: Rig) -> None:
    rig.require_nodes()
    driver = open_hgml(rig)
    [card] = driver.cards()
    node = rig.root / "dev/alixpu_ppu0"
    assert os.minor(node.stat().st_rdev) == card.minor
    node.unlink()
    os.mknod(node, 0o20666, os.makedev(510, 2))  # the next PPU's minor
    with pytest.raises(ReadError, match="has minor 2, but the card reports 1"):
        driver.card_edits([card])


def test_a_missing_capability_node_is_refused(rig: Rig) -> None:
    rig.require_nodes()
    driver = open_hgml(rig)
    inst = driver.create(InstanceSpec(0, "4g.48gb", 0))
    for node in (rig.root / "dev/alixpu-caps").iterdir():
        node.unlink()
    with pytest.raises(ReadError, match=r"/dev/alixpu-caps/alixpu-cap\d+ is missing"):
        driver.container_edits([inst])


def test_an_older_library_is_initialised_through_hgml_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = fake_hgml.build(tmp_path / "lib-old", old_init=True)
    rig = thead_rig(library, tmp_path, monkeypatch, [True])
    assert not hasattr(ctypes.CDLL(str(library)), "hgmlInit_v2")
    assert [c.model for c in open_hgml(rig).cards()] == ["PPU-96GB"]
    assert rig.fake.calls("hgmlInit") == 1
