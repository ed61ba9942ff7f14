"""The driver contract on T-Head and Hygon cards: the `hgml` and `dmi` drivers on their fake C
libraries, and the sim modelling the same cards, each checked against its card's own tables and
its vendor's identity rule."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from partkeeper.drivers import profiles
from partkeeper.drivers.base import (
    Driver,
    IdentityMismatchError,
    Instance,
    InstanceSpec,
    InUseError,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
)

from .vendor_harness import KINDS, VendorHarness, make

# How many instances of each profile an empty card holds: the measured counts (docs/drivers.md).
EMPTY_CARD_COUNTS = {
    "PPU-96GB": {"4g.48gb": 2, "8g.96gb": 1},
    "DCU-64GB": {"2g.15gb": 4, "4g.31gb": 2, "8g.63gb": 1},
}


@pytest.fixture(params=KINDS)
def vh(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    vendor_libraries: dict[str, Path],
) -> VendorHarness:
    return make(request.param, tmp_path, monkeypatch, vendor_libraries)


def _shapes(vh: VendorHarness) -> dict[str, profiles.Profile]:
    return profiles.model(vh.partition[0]).profiles


def _fill(driver: Driver, card: int, profile: profiles.Profile) -> list[Instance]:
    made: list[Instance] = []
    for start in profile.starts:
        if not any(profiles.overlaps((start, profile.size), m.placement) for m in made):
            made.append(driver.create(InstanceSpec(card, profile.name, start)))
    return made


def test_cards_models_and_modes(vh: VendorHarness) -> None:
    cards = vh.driver.cards()
    assert [c.index for c in cards] == list(range(len(vh.partition) + len(vh.sliced)))
    assert [c.model for c in cards] == vh.partition + vh.sliced
    assert [c.mode for c in cards] == ["partition"] * len(vh.partition) + ["sliced"] * len(
        vh.sliced
    )
    assert len({c.uuid for c in cards}) == len(cards)
    assert vh.driver.cards() == cards


def test_empty_card_holds_the_measured_counts(vh: VendorHarness) -> None:
    expected = EMPTY_CARD_COUNTS[vh.partition[0]]
    assert set(_shapes(vh)) == set(expected)
    for name, count in expected.items():
        shape = _shapes(vh)[name]
        assert profiles.max_instances(shape) == count
        made = _fill(vh.driver, 0, shape)
        assert len(made) == count
        assert sorted(i.uuid for i in vh.driver.instances(0)) == sorted(m.uuid for m in made)
        with pytest.raises(PlacementError):
            vh.driver.create(InstanceSpec(0, name, shape.starts[-1]))
        for inst in made:
            vh.driver.destroy(inst)


def test_create_at_every_legal_placement(vh: VendorHarness) -> None:
    for name, shape in _shapes(vh).items():
        for start in shape.starts:
            inst = vh.driver.create(InstanceSpec(0, name, start))
            assert inst.spec == InstanceSpec(0, name, start) and inst.size == shape.size
            assert (inst.gi_id, inst.ci_id) == (1, 0)
            assert inst.uuid.startswith("MIG-")
            assert vh.driver.instances(0) == [inst]
            vh.driver.destroy(inst)
            assert vh.driver.instances(0) == []


def test_illegal_start_unknown_profile_and_sliced_card_are_refused(vh: VendorHarness) -> None:
    name = max(_shapes(vh).values(), key=lambda p: p.size).name
    with pytest.raises(PlacementError) as err:
        vh.driver.create(InstanceSpec(0, name, 1))
    assert "card 0" in str(err.value) and "start 1" in str(err.value)
    with pytest.raises(PlacementError):
        vh.driver.create(InstanceSpec(0, "1g.10gb", 0))  # an NVIDIA profile
    if vh.sliced:
        with pytest.raises(PlacementError):
            vh.driver.create(InstanceSpec(len(vh.partition), name, 0))
    assert vh.driver.instances(0) == []


def test_overlap_is_refused_and_named(vh: VendorHarness) -> None:
    small = min(_shapes(vh).values(), key=lambda p: p.size)
    held = vh.driver.create(InstanceSpec(0, small.name, 0))
    big = max(_shapes(vh).values(), key=lambda p: p.size)
    with pytest.raises(PlacementError) as err:
        vh.driver.create(InstanceSpec(0, big.name, 0))
    assert held.uuid in str(err.value) and "overlap" in str(err.value)
    assert vh.driver.instances(0) == [held]


def test_gpu_instance_ids_are_lowest_free(vh: VendorHarness) -> None:
    small = min(_shapes(vh).values(), key=lambda p: p.size)
    made = [vh.driver.create(InstanceSpec(0, small.name, s)) for s in small.starts[:2]]
    assert [m.gi_id for m in made] == [1, 2]
    vh.driver.destroy(made[0])
    assert vh.driver.create(InstanceSpec(0, small.name, small.starts[0])).gi_id == 1


def test_identity_of_a_successor_at_the_same_slot_follows_the_vendor(vh: VendorHarness) -> None:
    """T-Head reproduces the predecessor's UUID (as NVIDIA); Hygon issues a fresh one, so its
    driver refuses a destroy aimed at the predecessor and the successor survives."""
    small = min(_shapes(vh).values(), key=lambda p: p.size)
    first = vh.driver.create(InstanceSpec(0, small.name, 0))
    vh.driver.destroy(first)
    successor = vh.driver.create(InstanceSpec(0, small.name, 0))
    assert (successor.gi_id, successor.start) == (first.gi_id, first.start)
    if vh.fresh_identity:
        assert successor.uuid != first.uuid
        with pytest.raises(IdentityMismatchError):
            vh.driver.destroy(first)
        assert vh.driver.instances(0) == [successor]
    else:
        assert successor == first


@pytest.mark.parametrize("change", ["uuid", "start", "profile"])
def test_destroy_with_a_wrong_identity_is_refused(vh: VendorHarness, change: str) -> None:
    shapes = _shapes(vh)
    small = min(shapes.values(), key=lambda p: p.size)
    inst = vh.driver.create(InstanceSpec(0, small.name, 0))
    other = next(n for n in shapes if n != small.name)
    wrong = dataclasses.replace(inst, **{
        "uuid": {"uuid": "MIG-00000000-0000-0000-0000-000000000000"},
        "start": {"start": small.starts[1]},
        "profile": {"profile": other},
    }[change])
    with pytest.raises(IdentityMismatchError) as err:
        vh.driver.destroy(wrong)
    assert f"GPU instance {inst.gi_id}" in str(err.value)
    assert vh.driver.instances(0) == [inst]


def test_busy_instance_refuses_destroy(vh: VendorHarness) -> None:
    small = min(_shapes(vh).values(), key=lambda p: p.size)
    inst = vh.driver.create(InstanceSpec(0, small.name, 0))
    vh.set_busy(inst, True)
    if vh.busy_known:
        assert vh.driver.is_busy(inst) is True
    else:
        with pytest.raises(ReadError, match="no per-partition process query"):
            vh.driver.is_busy(inst)
    with pytest.raises(InUseError) as err:
        vh.driver.destroy(inst)
    assert inst.uuid in str(err.value)
    assert vh.driver.instances(0) == [inst]
    vh.set_busy(inst, False)
    vh.driver.destroy(inst)
    assert vh.driver.instances(0) == []


def test_absent_instance_is_not_found(vh: VendorHarness) -> None:
    small = min(_shapes(vh).values(), key=lambda p: p.size)
    inst = vh.driver.create(InstanceSpec(0, small.name, 0))
    vh.driver.destroy(inst)
    with pytest.raises(NotFoundError):
        vh.driver.destroy(inst)


def test_failed_list_is_a_read_error_never_an_empty_list(vh: VendorHarness) -> None:
    big = max(_shapes(vh).values(), key=lambda p: p.size)
    inst = vh.driver.create(InstanceSpec(0, big.name, 0))
    vh.break_next_list()
    with pytest.raises(ReadError):
        vh.driver.instances(0)
    assert vh.driver.instances(0) == [inst]


def test_one_partition_per_container(vh: VendorHarness) -> None:
    small = min(_shapes(vh).values(), key=lambda p: p.size)
    a, b = (vh.driver.create(InstanceSpec(0, small.name, s)) for s in small.starts[:2])
    with pytest.raises(PlacementError, match="exactly one partition"):
        vh.driver.container_edits([a, b])


@pytest.mark.parametrize("kind", ["hgml", "dmi"])
def test_probe_view_shows_the_library_beside_the_tables(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor_libraries: dict[str, Path]
) -> None:
    vh = make(kind, tmp_path, monkeypatch, vendor_libraries)
    card = vh.driver.probe_view(0)  # type: ignore[attr-defined]
    assert card["mig"]["current"] is True
    offered = {p["name"]: p for p in card["profiles"] if p["offered"]}
    assert set(offered) == set(EMPTY_CARD_COUNTS[vh.partition[0]])
    assert all(p["matches"] for p in offered.values())
    assert vh.driver.instances(0) == []  # read-only


@pytest.mark.parametrize("kind", ["hgml", "dmi"])  # the sim makes both halves in one step
def test_a_gpu_instance_left_without_compute_instance_is_completed_by_the_retry(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor_libraries: dict[str, Path]
) -> None:
    vh = make(kind, tmp_path, monkeypatch, vendor_libraries)
    assert vh.rig is not None
    small = min(_shapes(vh).values(), key=lambda p: p.size)
    prefix = "hgml" if vh.kind == "hgml" else "nvml"
    vh.rig.fake.fail(f"{prefix}GpuInstanceCreateComputeInstance", 999)
    vh.rig.fake.fail(f"{prefix}GpuInstanceDestroy", 999)  # and the undo fails too
    with pytest.raises(UnknownError, match="undoing it failed too"):
        vh.driver.create(InstanceSpec(0, small.name, 0))
    (left,) = vh.driver.instances(0)
    assert (left.ci_id, left.uuid) == (-1, "")
    done = vh.driver.create(InstanceSpec(0, small.name, 0))
    assert (done.gi_id, done.start) == (left.gi_id, 0) and done.ci_id >= 0 and done.uuid
    assert vh.driver.instances(0) == [done]
