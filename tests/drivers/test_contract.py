"""The driver contract, run on every harness (harness.py): `sim` and `nvml` on NVIDIA cards, `hgml`
and `sim-ppu` on T-Head PPUs, `dmi` and `sim-dcu` on Hygon DCUs.

Each test states the contract once; what differs between vendors is read from the harness (its
node, its vendor's identity rule, whether busy can be read, which faults its fake injects) and
from the profile tables, never from which driver it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from partkeeper.drivers import probe, profiles
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
from tests_support.drivers import Harness, Shape

# How many instances of each profile an empty card holds: for NVIDIA docs/contract.md section 6,
# for the T-Head PPU and the Hygon DCU the counts measured on one card (docs/drivers.md).
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
    "PPU-96GB": {"4g.48gb": 2, "8g.96gb": 1},
    "DCU-64GB": {"2g.15gb": 4, "4g.31gb": 2, "8g.63gb": 1},
}  # fmt: skip
UNKNOWN_PROFILE = "5g.50gb"  # in no vendor's tables


def _fill(driver: Driver, card: int, profile: profiles.Profile) -> list[Instance]:
    """Create `profile` at the lowest free legal start until none is left."""
    made: list[Instance] = []
    for start in profile.starts:
        if not any(profiles.overlaps((start, profile.size), m.placement) for m in made):
            made.append(driver.create(InstanceSpec(card, profile.name, start)))
    return made


def _by_gi(instances: list[Instance]) -> list[Instance]:
    return sorted(instances, key=lambda i: i.gi_id)


def test_cards_are_numbered_partition_first_then_sliced(harness: Harness) -> None:
    node = harness.node
    cards = harness.driver.cards()
    assert [c.index for c in cards] == list(range(len(node.models)))
    assert [c.model for c in cards] == list(node.models)
    assert [c.mode for c in cards] == ["partition"] * len(node.partition) + ["sliced"] * len(
        node.sliced
    )
    assert len({c.uuid for c in cards}) == len(cards)
    assert harness.driver.cards() == cards  # stable identity


def test_each_model_offers_exactly_its_counted_profiles(harness: Harness) -> None:
    for model in harness.node.partition:
        assert set(profiles.model(model).profiles) == set(EMPTY_CARD_COUNTS[model])


def test_empty_card_holds_its_counts(harness: Harness, shape: Shape) -> None:
    card, profile = shape.card, shape.profile
    count = EMPTY_CARD_COUNTS[shape.model][profile.name]
    assert profiles.max_instances(profile) == count
    made = _fill(harness.driver, card, profile)
    assert len(made) == count
    listed = harness.driver.instances(card)
    assert sorted(i.uuid for i in listed) == sorted(m.uuid for m in made)
    # The card is full for this profile: every start collides.
    with pytest.raises(PlacementError):
        harness.driver.create(InstanceSpec(card, profile.name, profile.starts[-1]))


def test_create_at_every_legal_placement(harness: Harness, shape: Shape) -> None:
    card, profile = shape.card, shape.profile
    for start in profile.starts:
        inst = harness.driver.create(InstanceSpec(card, profile.name, start))
        assert inst.spec == InstanceSpec(card, profile.name, start) and inst.size == profile.size
        # the lowest free GI id on an empty card, or NVML's id of the slot (GI 0 for a full card)
        assert (inst.gi_id, inst.ci_id) == (harness.new_gi(start, profile.size, 1), 0)
        assert inst.uuid.startswith("MIG-")
        assert harness.driver.instances(card) == [inst]
        harness.driver.destroy(inst)
        assert harness.driver.instances(card) == []


def test_illegal_start_is_refused(harness: Harness, shape: Shape) -> None:
    card, profile = shape.card, shape.profile
    slices = profiles.model(shape.model).slices
    illegal = [s for s in range(slices + 1) if s not in profile.starts]  # and one past the card
    for start in illegal:
        with pytest.raises(PlacementError) as err:
            harness.driver.create(InstanceSpec(card, profile.name, start))
        assert f"card {card}" in str(err.value) and f"start {start}" in str(err.value)
    assert harness.driver.instances(card) == []


def test_unknown_profile_is_refused(harness: Harness) -> None:
    other = next(m for m in profiles.MODELS.values() if m.vendor != harness.vendor)
    foreign = min(other.profiles.values(), key=lambda p: p.size)  # another vendor's profile
    for name in (UNKNOWN_PROFILE, foreign.name):
        with pytest.raises(PlacementError):
            harness.driver.create(InstanceSpec(0, name, 0))
    assert harness.driver.instances(0) == []


def test_a_sliced_card_refuses_partitions(harness: Harness) -> None:
    if not harness.node.sliced:
        pytest.skip(f"{harness.kind}: no sliced card on this node")
    sliced = len(harness.node.partition)
    with pytest.raises(PlacementError):
        harness.driver.create(InstanceSpec(sliced, harness.smallest.name, 0))
    assert harness.driver.instances(sliced) == []


def test_overlap_is_refused_and_named(harness: Harness, shape: Shape) -> None:
    card = shape.card
    held = harness.driver.create(InstanceSpec(card, shape.profile.name, shape.profile.starts[0]))
    for other in profiles.model(shape.model).profiles.values():
        for start, size in other.placements():
            if not profiles.overlaps((start, size), held.placement):
                continue
            with pytest.raises(PlacementError) as err:
                harness.driver.create(InstanceSpec(card, other.name, start))
            message = str(err.value)
            assert f"card {card}" in message and held.uuid in message and "overlap" in message
    assert harness.driver.instances(card) == [held]


def test_gpu_instance_ids_follow_the_vendor(harness: Harness) -> None:
    """The lowest free id from 1 (sim, HGML, DMI), or the slot's own id (NVML)."""
    made = _fill(harness.driver, 0, harness.smallest)
    assert [m.gi_id for m in made] == [
        harness.new_gi(m.start, m.size, n) for n, m in enumerate(made, start=1)
    ]
    first, last = made[0], made[-1]
    harness.driver.destroy(first)
    harness.driver.destroy(last)
    again = harness.driver.create(InstanceSpec(0, last.profile, last.start))
    # the lowest free id, not the one its slot had; or, for NVML, exactly the one its slot had
    assert again.gi_id == harness.new_gi(last.start, last.size, first.gi_id)


def test_gpu_instance_ids_are_per_card(harness: Harness) -> None:
    if len(harness.node.partition) < 2:
        pytest.skip(f"{harness.kind}: one partition-mode card on this node")
    _fill(harness.driver, 0, harness.smallest)
    model = profiles.model(harness.node.partition[1])
    smallest = min(model.profiles.values(), key=lambda p: p.size)
    other_card = harness.driver.create(InstanceSpec(1, smallest.name, smallest.starts[-1]))
    assert other_card.gi_id == harness.new_gi(other_card.start, other_card.size, 1)


def test_identity_of_a_successor_at_the_same_slot_follows_the_vendor(harness: Harness) -> None:
    """NVIDIA and T-Head reproduce the predecessor's UUID; Hygon issues a fresh one, so its driver
    refuses a destroy aimed at the predecessor and the successor survives."""
    small = harness.smallest
    neighbour = harness.driver.create(InstanceSpec(0, small.name, small.starts[1]))
    first = harness.driver.create(InstanceSpec(0, small.name, small.starts[0]))
    harness.driver.destroy(first)
    successor = harness.driver.create(InstanceSpec(0, small.name, small.starts[0]))
    assert (successor.gi_id, successor.start) == (first.gi_id, first.start)
    assert successor.uuid != neighbour.uuid
    # The driver's own identity rule says the same as what its destroy does below.
    assert harness.driver.same_partition(first, successor) is harness.reproduces_identity
    if harness.reproduces_identity:
        assert successor == first  # same GI id, placement and UUID: the measured hazard
        # So the driver cannot tell a stale record from the live successor; only claims can. The
        # stale identity destroys the successor, which is why partkeeper never acts on one.
        harness.driver.destroy(first)
        assert harness.driver.instances(0) == [neighbour]
    else:
        assert successor.uuid != first.uuid
        with pytest.raises(IdentityMismatchError):
            harness.driver.destroy(first)
        assert _by_gi(harness.driver.instances(0)) == _by_gi([neighbour, successor])


def test_each_listed_partition_is_what_its_create_reported_by_the_drivers_rule(
    harness: Harness,
) -> None:
    small = harness.smallest
    made = [harness.driver.create(InstanceSpec(0, small.name, s)) for s in small.starts[:2]]
    listed = harness.driver.instances(0)
    for inst in made:
        assert [i for i in listed if harness.driver.same_partition(inst, i)] == [inst]


@pytest.mark.parametrize("change", ["uuid", "start", "profile"])
def test_destroy_with_a_wrong_identity_is_refused(harness: Harness, change: str) -> None:
    small = harness.smallest
    inst = harness.driver.create(InstanceSpec(0, small.name, small.starts[0]))
    other = next(n for n in harness.tables if n != small.name)
    changes: dict[str, dict[str, Any]] = {
        "uuid": {"uuid": "MIG-00000000-0000-0000-0000-000000000000"},
        "start": {"start": small.starts[1]},
        "profile": {"profile": other},
    }
    wrong = dataclasses.replace(inst, **changes[change])
    assert not harness.driver.same_partition(wrong, inst)
    with pytest.raises(IdentityMismatchError) as err:
        harness.driver.destroy(wrong)
    assert "card 0" in str(err.value) and f"GPU instance {inst.gi_id}" in str(err.value)
    assert harness.driver.instances(0) == [inst]


def _assert_busy(harness: Harness, inst: Instance, busy: bool) -> None:
    """is_busy says `busy`, or, where the library cannot tell, raises ReadError saying why."""
    if harness.busy_unknown is None:
        assert harness.driver.is_busy(inst) is busy
    else:
        with pytest.raises(ReadError, match=harness.busy_unknown):
            harness.driver.is_busy(inst)


def test_busy_instance_refuses_destroy(harness: Harness) -> None:
    profile, start = harness.away_from_zero
    inst = harness.driver.create(InstanceSpec(0, profile.name, start))
    _assert_busy(harness, inst, False)
    harness.set_busy(inst, True)
    _assert_busy(harness, inst, True)
    with pytest.raises(InUseError) as err:
        harness.driver.destroy(inst)
    assert "card 0" in str(err.value) and inst.uuid in str(err.value)
    assert harness.driver.instances(0) == [inst]
    harness.set_busy(inst, False)
    harness.driver.destroy(inst)
    assert harness.driver.instances(0) == []


def test_absent_instance_is_not_found(harness: Harness) -> None:
    small = harness.smallest
    inst = harness.driver.create(InstanceSpec(0, small.name, small.starts[-1]))
    harness.driver.destroy(inst)
    with pytest.raises(NotFoundError) as err:
        harness.driver.destroy(inst)
    assert "card 0" in str(err.value) and inst.uuid in str(err.value)
    never = dataclasses.replace(inst, gi_id=inst.gi_id + 1)
    with pytest.raises(NotFoundError):
        harness.driver.destroy(never)


def test_failed_list_is_a_read_error_never_an_empty_list(harness: Harness) -> None:
    inst = harness.driver.create(InstanceSpec(0, harness.largest.name, 0))
    harness.fail("list")
    with pytest.raises(ReadError) as err:
        harness.driver.instances(0)
    assert "card 0" in str(err.value)
    assert harness.driver.instances(0) == [inst]


def test_a_container_gets_its_partitions_as_its_vendor_allows(harness: Harness) -> None:
    """NVIDIA's runtime takes several MIG devices per container; T-Head's and Hygon's one."""
    small = harness.smallest
    a, b = (harness.driver.create(InstanceSpec(0, small.name, s)) for s in small.starts[:2])
    if harness.vendor in profiles.ONE_PARTITION_PER_CONTAINER:
        with pytest.raises(PlacementError, match="exactly one partition"):
            harness.driver.container_edits([a, b])
    else:
        env = harness.driver.container_edits([a, b]).env
        assert all(any(i.uuid in value for value in env.values()) for i in (a, b))


def test_whole_cards_are_handed_over_as_their_vendor_hands_them(harness: Harness) -> None:
    """What a container needs for the cards its logical slices sit on: the card UUIDs where the
    vendor's runtime takes them from the env (NVIDIA), the shared nodes once and each card's own,
    the vendor's mounts; as many cards as it is given. The mode does not matter: the last card is
    sliced on the NVIDIA and T-Head nodes and in partition mode on Hygon's (its mode is
    node-wide, and this node's is on)."""
    cards = harness.driver.cards()
    nodes = harness.card_nodes
    for given in (cards[-1:], cards):
        edits = harness.driver.card_edits(given)
        env = harness.cards_env
        assert edits.env == ({} if env is None else {env: ",".join(c.uuid for c in given)})
        own = [path for card in given for path in nodes.own(card.index)]
        assert [d.container_path for d in edits.devices] == [*nodes.shared, *own]
        assert [(m.container_path, m.read_only) for m in edits.mounts] == [
            (path, True) for path in nodes.mounts]
        # Host paths are the container paths under the driver root.
        assert all(d.host_path.endswith(d.container_path) for d in edits.devices)
        assert all(m.host_path.endswith(m.container_path) for m in edits.mounts)


def test_probe_view_shows_the_library_beside_the_tables(harness: Harness) -> None:
    inst = harness.driver.create(InstanceSpec(0, harness.smallest.name, 0))
    view = probe.gather(harness.driver)
    for card in view["cards"]:
        partition = card["mode"] == "partition"
        assert card["mig"]["current"] is partition
        if partition:
            tables = profiles.model(card["model"]).profiles
            # Every profile of the tables is offered, in the tables' placements; one the library
            # has beyond them (NVIDIA's +me, T-Head's +gfx) is shown, not offered, with no verdict.
            verdicts = {p["name"]: p["matches"] for p in card["profiles"]}
            assert {n: verdicts.get(n) for n in tables} == dict.fromkeys(tables, True)
            extra = [p for p in card["profiles"] if p["name"] not in tables]
            assert all(p["matches"] is None and not p.get("offered") for p in extra)
    assert [i["uuid"] for i in view["cards"][0]["instances"]] == [inst.uuid]
    assert harness.driver.instances(0) == [inst]  # read-only


def test_a_gpu_instance_left_without_compute_instance_is_completed_by_the_retry(
    harness: Harness,
) -> None:
    """What a crash inside create leaves (a GI without CI at the claim's spec) is finished by the
    retried create, so the claim gets a UUID instead of adopting an instance without one."""
    profile, start = harness.away_from_zero
    spec = InstanceSpec(0, profile.name, start)
    harness.fail("ci_create")
    harness.fail("gi_destroy")  # and the undo fails too
    with pytest.raises(UnknownError, match="undoing it failed too"):
        harness.driver.create(spec)
    (left,) = harness.driver.instances(0)
    assert (left.start, left.ci_id, left.uuid, left.complete) == (start, -1, "", False)
    done = harness.driver.create(spec)
    assert (done.gi_id, done.start) == (left.gi_id, start) and done.ci_id >= 0
    assert done.complete and done.uuid.startswith("MIG-")
    assert harness.driver.instances(0) == [done]


def test_a_gpu_instance_without_compute_instance_is_not_busy(harness: Harness) -> None:
    """No process can run where no compute instance is: the busy check of the GI a failed create
    left says not busy (or, where the library cannot count, why not), rather than failing the read
    on HGML only, as it did when each vendor had its own busy check (mig.MigDriver.is_busy)."""
    profile, start = harness.away_from_zero
    harness.fail("ci_create")
    harness.fail("gi_destroy")  # and the undo fails too
    with pytest.raises(UnknownError, match="undoing it failed too"):
        harness.driver.create(InstanceSpec(0, profile.name, start))
    (left,) = harness.driver.instances(0)
    assert not left.complete
    _assert_busy(harness, left, False)
