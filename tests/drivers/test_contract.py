"""The driver contract, run on both drivers: `sim` on a temp state file, `nvml` on fake NVML."""

from __future__ import annotations

import dataclasses

import pytest

from partkeeper.drivers import base, profiles
from partkeeper.drivers.base import Driver, Instance, InstanceSpec

from .driver_harness import PARTITION_CARDS, SLICED_CARDS, Harness

H100, A100, H200, SLICED = 0, 1, 2, 3

# docs/contract.md section 6: how many instances of each profile an empty card holds.
EMPTY_CARD_COUNTS = {
    "A100-40GB": {
        "1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1,
    },
    "H100-80GB": {
        "1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1,
    },
    "H200-141GB": {
        "1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1,
    },
}  # fmt: skip
COUNT_CASES = [
    (model, profile, count)
    for model, counts in EMPTY_CARD_COUNTS.items()
    for profile, count in counts.items()
]


def _fill(driver: Driver, card: int, profile: profiles.Profile) -> list[Instance]:
    """Create `profile` at the lowest free legal start until none is left."""
    made: list[Instance] = []
    for start in profile.starts:
        if not any(profiles.overlaps((start, profile.size), m.placement) for m in made):
            made.append(driver.create(InstanceSpec(card, profile.name, start)))
    return made


def test_cards_are_numbered_partition_first_then_sliced(harness: Harness) -> None:
    cards = harness.driver.cards()
    assert [c.index for c in cards] == [0, 1, 2, 3]
    assert [c.model for c in cards] == PARTITION_CARDS + SLICED_CARDS
    assert [c.mode for c in cards] == ["partition"] * 3 + ["sliced"]
    assert len({c.uuid for c in cards}) == 4
    assert harness.driver.cards() == cards  # stable identity


@pytest.mark.parametrize(("model", "profile", "count"), COUNT_CASES)
def test_empty_card_holds_design_counts(harness: Harness, model: str, profile: str, count: int):
    card = PARTITION_CARDS.index(model)
    shape = profiles.model(model).profiles[profile]
    assert profiles.max_instances(shape) == count
    made = _fill(harness.driver, card, shape)
    assert len(made) == count
    listed = harness.driver.instances(card)
    assert sorted(i.uuid for i in listed) == sorted(m.uuid for m in made)
    # The card is full for this profile: every start collides.
    with pytest.raises(base.PlacementError):
        harness.driver.create(InstanceSpec(card, profile, shape.starts[-1]))


@pytest.mark.parametrize("profile", sorted(profiles.model("H100-80GB").profiles))
def test_create_at_every_legal_placement(harness: Harness, profile: str) -> None:
    shape = profiles.model("H100-80GB").profiles[profile]
    for start in shape.starts:
        inst = harness.driver.create(InstanceSpec(H100, profile, start))
        assert inst.spec == InstanceSpec(H100, profile, start) and inst.size == shape.size
        assert (inst.gi_id, inst.ci_id) == (1, 0)  # the lowest free GI id on an empty card
        assert inst.uuid.startswith("MIG-")
        assert harness.driver.instances(H100) == [inst]
        harness.driver.destroy(inst)
        assert harness.driver.instances(H100) == []


@pytest.mark.parametrize(("profile", "start"), [("3g.40gb", 2), ("2g.20gb", 6), ("1g.10gb", 7)])
def test_illegal_start_is_refused(harness: Harness, profile: str, start: int) -> None:
    with pytest.raises(base.PlacementError) as err:
        harness.driver.create(InstanceSpec(H100, profile, start))
    assert "card 0" in str(err.value) and f"start {start}" in str(err.value)
    assert harness.driver.instances(H100) == []


def test_unknown_profile_and_sliced_card_are_refused(harness: Harness) -> None:
    with pytest.raises(base.PlacementError):
        harness.driver.create(InstanceSpec(H100, "5g.50gb", 0))
    with pytest.raises(base.PlacementError):
        harness.driver.create(InstanceSpec(SLICED, "1g.5gb", 0))
    assert harness.driver.instances(SLICED) == []


@pytest.mark.parametrize(("profile", "start"), [("1g.10gb", 1), ("1g.20gb", 0), ("4g.40gb", 0)])
def test_overlap_is_refused_and_named(harness: Harness, profile: str, start: int) -> None:
    held = harness.driver.create(InstanceSpec(H100, "2g.20gb", 0))
    with pytest.raises(base.PlacementError) as err:
        harness.driver.create(InstanceSpec(H100, profile, start))
    message = str(err.value)
    assert "card 0" in message and held.uuid in message and "overlap" in message
    assert harness.driver.instances(H100) == [held]


def test_gpu_instance_ids_are_lowest_free(harness: Harness) -> None:
    made = [harness.driver.create(InstanceSpec(H100, "1g.10gb", s)) for s in (0, 1, 2)]
    assert [m.gi_id for m in made] == [1, 2, 3]
    harness.driver.destroy(made[1])
    again = harness.driver.create(InstanceSpec(H100, "1g.10gb", 5))
    assert again.gi_id == 2
    other_card = harness.driver.create(InstanceSpec(A100, "1g.5gb", 3))
    assert other_card.gi_id == 1  # ids are per card


def test_successor_at_the_same_slot_reproduces_the_identity(harness: Harness) -> None:
    neighbour = harness.driver.create(InstanceSpec(H100, "1g.10gb", 1))
    first = harness.driver.create(InstanceSpec(H100, "1g.10gb", 0))
    harness.driver.destroy(first)
    successor = harness.driver.create(InstanceSpec(H100, "1g.10gb", 0))
    assert successor == first  # same GI id, placement and UUID: the measured hazard
    assert successor.uuid != neighbour.uuid
    # So the driver cannot tell a stale record from the live successor; only claims can. The stale
    # identity destroys the successor, which is why partkeeper never acts on one.
    harness.driver.destroy(first)
    assert harness.driver.instances(H100) == [neighbour]


@pytest.mark.parametrize(
    "change",
    [{"uuid": "MIG-00000000-0000-0000-0000-000000000000"}, {"start": 2}, {"profile": "1g.20gb"}],
)
def test_destroy_with_a_wrong_identity_is_refused(harness: Harness, change: dict) -> None:
    inst = harness.driver.create(InstanceSpec(H100, "1g.10gb", 0))
    wrong = dataclasses.replace(inst, **change)
    with pytest.raises(base.IdentityMismatchError) as err:
        harness.driver.destroy(wrong)
    assert "card 0" in str(err.value) and f"GPU instance {inst.gi_id}" in str(err.value)
    assert harness.driver.instances(H100) == [inst]


def test_busy_instance_refuses_destroy(harness: Harness) -> None:
    inst = harness.driver.create(InstanceSpec(H100, "3g.40gb", 4))
    assert harness.driver.is_busy(inst) is False
    harness.set_busy(inst, True)
    assert harness.driver.is_busy(inst) is True
    with pytest.raises(base.InUseError) as err:
        harness.driver.destroy(inst)
    assert "card 0" in str(err.value) and inst.uuid in str(err.value)
    assert harness.driver.instances(H100) == [inst]
    harness.set_busy(inst, False)
    harness.driver.destroy(inst)
    assert harness.driver.instances(H100) == []


def test_absent_instance_is_not_found(harness: Harness) -> None:
    inst = harness.driver.create(InstanceSpec(H100, "1g.10gb", 3))
    harness.driver.destroy(inst)
    with pytest.raises(base.NotFoundError) as err:
        harness.driver.destroy(inst)
    assert "card 0" in str(err.value) and inst.uuid in str(err.value)
    never = dataclasses.replace(inst, gi_id=6)
    with pytest.raises(base.NotFoundError):
        harness.driver.destroy(never)


def test_failed_list_is_a_read_error_never_an_empty_list(harness: Harness) -> None:
    inst = harness.driver.create(InstanceSpec(H100, "7g.80gb", 0))
    harness.break_next_list()
    with pytest.raises(base.ReadError) as err:
        harness.driver.instances(H100)
    assert "card 0" in str(err.value)
    assert harness.driver.instances(H100) == [inst]
