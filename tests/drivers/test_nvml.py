"""What only the nvml driver has: NVML's names and ids, undoing half-made instances, error codes.

All of it over the real nvidia-ml-py and the fake libnvidia-ml.so.1 built against nvml.h.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from fakes import nvml as nv
from fakes.nvml import FakeNvml

from partkeeper.config import Config
from partkeeper.drivers import open_driver
from partkeeper.drivers.base import (
    InstanceSpec,
    InUseError,
    LibraryMissing,
    ModeOffError,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
)
from partkeeper.drivers.nvidia.binding import NvmlDriver, model_for
from partkeeper.drivers.nvidia.tables import placements
from partkeeper.errors import StartupError
from partkeeper_sim.driver import SimDriver
from services.allocator.core import catalog

H100, A100 = 0, 1


def carve(card: int, profile_const: int, start: int, *, with_ci: bool = True) -> None:
    """Make an instance by hand through NVML itself, as nvidia-smi would."""
    dev = pynvml.nvmlDeviceGetHandleByIndex(card)
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, profile_const)
    spot = pynvml.c_nvmlGpuInstancePlacement_t()
    spot.start, spot.size = next(p for p in placements(pynvml, dev, info.id) if p[0] == start)
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(dev, info.id, ctypes.byref(spot))
    if with_ci:
        ci = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0)
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci.id)


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


# -- the ABI: what a real GPU would crash on or reject -------------------------------------------


def test_a_placement_struct_passed_by_value_is_caught(fake_nvml: FakeNvml) -> None:
    """nvidia-ml-py sets no argtypes: a struct passed where the header wants a pointer reaches
    the C function as its packed bytes. On a GPU that is a read of a garbage address; the fake
    detects it without touching it, refuses, and records the complaint."""
    NvmlDriver()
    dev = pynvml.nvmlDeviceGetHandleByIndex(H100)
    spot = pynvml.c_nvmlGpuInstancePlacement_t()
    spot.start, spot.size = 0, 1
    with pytest.raises(pynvml.NVMLError) as err:
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 19, spot)
    assert err.value.value == nv.ERROR_INVALID_ARGUMENT
    count, last = fake_nvml.complaints()
    assert count == 1 and "placement" in last and "0x100000000" in last  # start 0 | size 1 << 32
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 19, ctypes.byref(spot))
    assert pynvml.nvmlGpuInstanceGetInfo(gi).placement.size == 1


def test_a_garbage_pointer_is_refused_without_a_crash(fake_nvml: FakeNvml) -> None:
    NvmlDriver()
    fn = ctypes.CDLL(str(fake_nvml.library)).nvmlDeviceGetCount_v2
    assert fn(ctypes.c_void_p(0x1234)) == nv.ERROR_INVALID_ARGUMENT
    assert fake_nvml.complaints()[0] == 1


def test_a_versioned_struct_without_its_version_is_refused(fake_nvml: FakeNvml) -> None:
    NvmlDriver()
    dev = pynvml.nvmlDeviceGetHandleByIndex(H100)
    fn = ctypes.CDLL(str(fake_nvml.library)).nvmlDeviceGetGpuInstanceProfileInfoV
    bare = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    bare.version = 0
    assert fn(dev, 0, ctypes.byref(bare)) == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert "version" in fake_nvml.complaints()[1]


def test_unversioned_and_versioned_profile_calls_agree(no_complaints: FakeNvml) -> None:
    NvmlDriver()
    dev = pynvml.nvmlDeviceGetHandleByIndex(H100)
    const = pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    v1 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, const, version=1)
    v2 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(dev, const)
    assert (v1.id, v1.sliceCount, v1.instanceCount) == (v2.id, v2.sliceCount, v2.instanceCount)
    carve(H100, const, 4, with_ci=False)
    gi = pynvml.nvmlDeviceGetGpuInstanceById(dev, 2)  # the slot's id: the second half
    c1 = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, 0, version=1)
    c2 = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, 0)
    assert (c1.id, c1.sliceCount, c1.instanceCount) == (c2.id, c2.sliceCount, 1)


def test_separate_processes_share_one_card_through_the_normal_library_lookup(
    fake_nvml: FakeNvml,
) -> None:
    code = (
        "from partkeeper.drivers.nvidia.binding import NvmlDriver; from partkeeper.drivers import "
        "InstanceSpec; print(NvmlDriver().create(InstanceSpec(0, '2g.20gb', 2)).uuid)"
    )
    env = {**os.environ, **fake_nvml.env()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    [listed] = NvmlDriver().instances(H100)
    assert listed.uuid == out.stdout.strip() and (listed.profile, listed.start) == ("2g.20gb", 2)


# -- what NVML reports against the built-in tables -----------------------------------------------


def test_profile_ids_and_placements_are_read_from_nvml(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    dev = pynvml.nvmlDeviceGetHandleByIndex(A100)
    info = driver.catalogue("probe", A100, dev)
    by_name = {p.name: p for p in info.profiles}
    assert by_name["1g.5gb"].id == 19 and by_name["1g.10gb"].id == 15  # REV2
    assert by_name["1g.10gb"].placements == ((0, 2), (2, 2), (4, 2), (6, 2))
    assert by_name["1g.5gb+me"].ours is None and info.problem == ""


def test_a_card_whose_nvml_view_disagrees_is_refused_and_says_why(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_profile(H100, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, (0, 2, 4), 3)
    driver = NvmlDriver()
    card = driver.cards()[H100]
    assert card.model == "NVIDIA H100 80GB HBM3" and "3g.40gb placements" in card.problem
    with pytest.raises(PlacementError, match=r"3g\.40gb placements"):
        driver.create(InstanceSpec(H100, "1g.10gb", 0))
    carve(H100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 3)
    assert [i.start for i in driver.instances(H100)] == [3]  # still listed, still occupied


def test_placements_in_another_order_agree_with_the_tables(no_complaints: FakeNvml) -> None:
    """nvml.h promises no order: the same placements listed highest start first are the same."""
    for const in (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
                  pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE):
        no_complaints.set_placements(H100, const, descending=True)
    driver = NvmlDriver()
    info = driver.catalogue("list", H100, pynvml.nvmlDeviceGetHandleByIndex(H100))
    three = next(p for p in info.profiles if p.name == "3g.40gb")
    assert three.placements == ((4, 4), (0, 4))  # as NVML listed them
    assert info.problem == "" and driver.cards()[H100].model == "H100-80GB"
    view = driver.probe_view(H100)
    assert all(p["matches"] for p in view["profiles"] if p["matches"] is not None)


@pytest.mark.parametrize("code", [nv.ERROR_NOT_SUPPORTED, nv.ERROR_INVALID_ARGUMENT])
def test_a_profile_nvml_cannot_place_has_no_placements(no_complaints: FakeNvml, code: int) -> None:
    """A profile the card lists but cannot place: the node's cards are still read. One the tables
    do not use (1g.10gb+me) changes nothing; a base one refuses that card alone, saying why."""
    no_complaints.set_placements(H100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, code)
    no_complaints.set_placements(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, code)
    driver = NvmlDriver()
    cards = driver.cards()  # no ReadError for the whole node
    answer = "Not Supported" if code == nv.ERROR_NOT_SUPPORTED else "Invalid Argument"
    assert (cards[H100].model, cards[H100].problem) == ("H100-80GB", "")
    assert cards[A100].problem == f"A100-40GB: NVML gives no placements for 2g.10gb ({answer})"
    assert cards[2].problem == ""  # the H200 is untouched
    me = next(p for p in driver.probe_view(H100)["profiles"] if p["name"] == "1g.10gb+me")
    assert (me["placements"], me["placements_error"]) == ([], answer)
    assert driver.create(InstanceSpec(H100, "1g.10gb", 0)).gi_id == 7


def test_a_refused_card_offers_no_resource(fake_nvml: FakeNvml) -> None:
    """What the allocator advertises from the driver's cards: nothing on the refused H100."""
    fake_nvml.set_profile(H100, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, (0,), 2)
    offers = catalog.offers(NvmlDriver().cards(), prefix="nvidia.com/mig-",
                            sliced_resource="nvidia.com/gpu.sliced", slices_per_card=4)
    assert "nvidia.com/mig-7g.80gb" not in offers and "nvidia.com/mig-3g.40gb" not in offers
    assert offers["nvidia.com/mig-7g.40gb"].cards == (A100,)  # the agreeing cards still offer
    assert offers["nvidia.com/gpu.sliced"].cards == (3,)


# -- instances the driver did not make, or did not finish ----------------------------------------


def test_a_hand_carved_me_instance_is_listed_and_blocks_its_slot(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    carve(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 3)
    [listed] = driver.instances(A100)
    assert (listed.profile, listed.start, listed.size) == ("1g.5gb+me", 3, 1)
    with pytest.raises(PlacementError):
        driver.create(InstanceSpec(A100, "2g.10gb", 2))


def test_a_gpu_instance_without_compute_instance_is_listed_and_destroyable(
    no_complaints: FakeNvml,
) -> None:
    driver = NvmlDriver()
    carve(H100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 4, with_ci=False)
    [leftover] = driver.instances(H100)
    assert (leftover.ci_id, leftover.uuid, leftover.start, leftover.complete) == (-1, "", 4, False)
    assert driver.is_busy(leftover) is False
    driver.destroy(leftover)
    assert driver.instances(H100) == []


@pytest.mark.parametrize(
    ("failing", "times", "step"),
    [
        ("nvmlGpuInstanceCreateComputeInstance", 1, "creating its compute instance"),
        # the CI handle's UUID, then the walk's: neither answers
        ("nvmlDeviceGetUUID", 2, "finding its MIG device UUID"),
    ],
)
def test_a_create_that_cannot_finish_undoes_its_gpu_instance(
    no_complaints: FakeNvml, failing: str, times: int, step: str
) -> None:
    driver = NvmlDriver()
    driver.cards()  # reads the card UUIDs before the failure is armed
    no_complaints.fail(failing, nv.ERROR_UNKNOWN, times=times)
    with pytest.raises(UnknownError) as err:
        driver.create(InstanceSpec(H100, "2g.20gb", 2))
    message = str(err.value)
    assert "card 0" in message and step in message and "destroyed again" in message
    assert driver.instances(H100) == []


def test_create_refuses_when_it_cannot_read_what_exists(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    no_complaints.fail("nvmlDeviceGetMigDeviceHandleByIndex", nv.ERROR_UNKNOWN)
    with pytest.raises(ReadError):
        driver.create(InstanceSpec(H100, "1g.10gb", 0))
    assert no_complaints.calls("nvmlDeviceCreateGpuInstanceWithPlacement") == 0


def test_nvml_refusing_a_placement_is_a_placement_error(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    code = nv.ERROR_INSUFFICIENT_RESOURCES
    no_complaints.fail("nvmlDeviceCreateGpuInstanceWithPlacement", code)
    with pytest.raises(PlacementError, match="Insufficient Resources"):
        driver.create(InstanceSpec(H100, "1g.10gb", 0))


@pytest.mark.parametrize(
    ("failing", "code", "error"),
    [
        ("nvmlDeviceGetGpuInstanceById", nv.ERROR_UNKNOWN, ReadError),
        ("nvmlDeviceGetGpuInstanceById", nv.ERROR_NOT_FOUND, NotFoundError),
        ("nvmlGpuInstanceGetInfo", nv.ERROR_NOT_FOUND, ReadError),  # a read, not an absence
        ("nvmlDeviceGetMigDeviceHandleByIndex", nv.ERROR_UNKNOWN, ReadError),
        ("nvmlComputeInstanceDestroy", nv.ERROR_IN_USE, InUseError),
        ("nvmlGpuInstanceDestroy", nv.ERROR_IN_USE, InUseError),
        ("nvmlGpuInstanceDestroy", nv.ERROR_NOT_FOUND, NotFoundError),
        ("nvmlGpuInstanceDestroy", nv.ERROR_UNKNOWN, UnknownError),
    ],
)
def test_destroy_maps_nvml_errors(
    no_complaints: FakeNvml, failing: str, code: int, error: type[Exception]
) -> None:
    driver = NvmlDriver()
    inst = driver.create(InstanceSpec(H100, "4g.40gb", 0))
    no_complaints.fail(failing, code)
    with pytest.raises(error) as err:
        driver.destroy(inst)
    assert type(err.value) is error and "card 0" in str(err.value)


WALK = "nvmlDeviceGetMaxMigDeviceCount"  # where every walk of the MIG device indices starts


def test_each_operation_walks_the_mig_devices_once(no_complaints: FakeNvml) -> None:
    """A walk of the MIG device indices is 1 + 7 index lookups + 3 reads per device found, and
    NVIDIA measured walks at seconds under load: create, busy check and destroy walk once each
    (create reads the new UUID from the CI's own device handle). Counts, not timings; the same
    figures as bench/nvml_calls.py."""
    fake, driver = no_complaints, NvmlDriver()
    driver.cards()  # the static card facts, read once
    for start in range(6):
        driver.create(InstanceSpec(H100, "1g.10gb", start))

    def counted(fn):
        calls, walks = fake.total_calls(), fake.calls(WALK)
        result = fn()
        return result, fake.total_calls() - calls, fake.calls(WALK) - walks

    walk = 1 + 7 + 3 * 6  # six MIG devices there
    inst, calls, walks = counted(lambda: driver.create(InstanceSpec(H100, "1g.10gb", 6)))
    # handle, MIG mode; 7 profiles' GIs, 6 described; the walk; GI, info, CI profile, CI, info, UUID
    assert (walks, calls) == (1, 2 + 7 + 6 + walk + 6)
    assert inst.uuid in {i.uuid for i in driver.instances(H100)}
    busy, calls, walks = counted(lambda: driver.is_busy(inst))
    walk += 3  # seven now
    assert (busy, walks, calls) == (False, 1, 1 + walk + 1)  # handle, walk, its processes
    _, calls, walks = counted(lambda: driver.destroy(inst))
    # handle, GI by id, its info; the walk; CI by id, CI destroy, GI destroy
    assert (walks, calls) == (1, 3 + walk + 3)


def test_a_ci_handle_nvml_does_not_answer_for_falls_back_to_the_walk(
    no_complaints: FakeNvml,
) -> None:
    driver = NvmlDriver()
    driver.cards()
    no_complaints.fail("nvmlDeviceGetUUID", nv.ERROR_UNKNOWN)  # the CI handle's, once
    inst = driver.create(InstanceSpec(H100, "2g.20gb", 2))
    assert driver.uuid_source == "walk" and driver.instances(H100) == [inst]


def test_a_ci_info_naming_the_parent_card_falls_back_to_one_walk(no_complaints: FakeNvml) -> None:
    """Where NVML's CI info names the parent card (as nvml.h words it) the create still finds its
    UUID, with one more walk rather than a card UUID taken for the partition's."""
    no_complaints.set_ci_info_parent(True)
    driver = NvmlDriver()
    driver.cards()
    walks = no_complaints.calls(WALK)
    inst = driver.create(InstanceSpec(H100, "2g.20gb", 2))
    assert no_complaints.calls(WALK) - walks == 2
    assert inst.uuid.startswith("MIG-") and driver.instances(H100) == [inst]


def test_a_destroy_after_mig_was_switched_off_is_mode_off(no_complaints: FakeNvml) -> None:
    """MIG off under the driver: NVML answers NOT_SUPPORTED for the GPU instance, and no GPU
    instance can exist, so the destroy reports the partition gone (a NotFoundError) saying why."""
    driver = NvmlDriver()
    inst = driver.create(InstanceSpec(H100, "7g.80gb", 0))
    no_complaints.set_mig_mode(H100, current=False)
    with pytest.raises(ModeOffError) as err:
        driver.destroy(inst)
    assert isinstance(err.value, NotFoundError) and err.value.kind == "mode_off"
    assert "Not Supported for GPU instance 0: MIG mode was switched off" in str(err.value)
    assert driver.instances(H100) == [] and driver.cards()[H100].mode == "sliced"


def test_a_gpu_instance_with_a_compute_instance_refuses_destroy(no_complaints: FakeNvml) -> None:
    """NVML's own rule, which the driver's order (CIs first) respects."""
    driver = NvmlDriver()
    driver.create(InstanceSpec(H100, "7g.80gb", 0))
    gi = pynvml.nvmlDeviceGetGpuInstanceById(pynvml.nvmlDeviceGetHandleByIndex(H100), 0)
    with pytest.raises(pynvml.NVMLError) as err:
        pynvml.nvmlGpuInstanceDestroy(gi)
    assert err.value.value == nv.ERROR_IN_USE


@pytest.mark.parametrize(
    ("failing", "code"),
    [
        ("nvmlDeviceGetGpuInstances", nv.ERROR_NOT_FOUND),  # even "not found" mid-read
        ("nvmlGpuInstanceGetInfo", nv.ERROR_NOT_FOUND),
        ("nvmlDeviceGetMaxMigDeviceCount", nv.ERROR_UNKNOWN),
        # NOT_FOUND here is NVML's documented "no MIG device at this index", so UNKNOWN.
        ("nvmlDeviceGetMigDeviceHandleByIndex", nv.ERROR_UNKNOWN),
        ("nvmlDeviceGetGpuInstanceId", nv.ERROR_NOT_FOUND),
        ("nvmlDeviceGetUUID", nv.ERROR_NOT_FOUND),
        ("nvmlDeviceGetMigMode", nv.ERROR_UNKNOWN),
        ("nvmlDeviceGetGpuInstanceProfileInfoV", nv.ERROR_UNKNOWN),
        ("nvmlDeviceGetGpuInstancePossiblePlacements_v2", nv.ERROR_UNKNOWN),
    ],
)
def test_any_failure_while_listing_is_a_read_error(
    no_complaints: FakeNvml, failing: str, code: int
) -> None:
    NvmlDriver().create(InstanceSpec(H100, "1g.10gb", 0))
    driver = NvmlDriver()  # fresh, so that its first listing also reads the static profile facts
    no_complaints.fail(failing, code)
    with pytest.raises(ReadError) as err:
        driver.instances(H100)
    assert "card 0" in str(err.value)
    no_complaints.clear_failures()
    assert len(driver.instances(H100)) == 1


def test_cards_without_mig_are_sliced(
    nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNvml.create(nvml_library, tmp_path / "other.state")
    fake.add_gpu("H100-80GB", mig=False)
    fake.add_gpu("T4")
    monkeypatch.setenv(fake.state_env, str(fake.state))
    driver = NvmlDriver()
    assert [(c.model, c.mode) for c in driver.cards()] == [
        ("H100-80GB", "sliced"),
        ("Tesla T4", "sliced"),
    ]
    assert driver.instances(0) == [] and driver.instances(1) == []
    with pytest.raises(PlacementError, match="MIG mode is not enabled"):
        driver.create(InstanceSpec(0, "1g.10gb", 0))


def test_nvml_that_cannot_start_is_one_startup_sentence(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(fake_nvml.state_env, str(tmp_path / "no-driver"))
    with pytest.raises(LibraryMissing) as err:
        NvmlDriver()
    assert isinstance(err.value, StartupError)
    assert "libnvidia-ml.so.1" in str(err.value) and "Driver Not Loaded" in str(err.value)
    assert "\n" not in str(err.value)


def test_open_driver_picks_the_configured_driver(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    sim = open_driver(Config(driver="sim", sim_state=tmp_path / "s.json"))
    assert isinstance(sim, SimDriver) and sim.path == tmp_path / "s.json"
    assert not (tmp_path / "s.json").exists()  # opening touches nothing
    assert isinstance(open_driver(Config(driver="nvml")), NvmlDriver)
    with pytest.raises(ValueError):
        open_driver(Config(driver="cuda"))  # type: ignore[arg-type]  # an invalid driver name on purpose


def test_the_package_imports_without_pynvml() -> None:
    code = (
        "import sys; import partkeeper.drivers, partkeeper.drivers.nvidia.binding, partkeeper.cli;"
        "partkeeper.cli.build_parser(); assert 'pynvml' not in sys.modules, 'imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
