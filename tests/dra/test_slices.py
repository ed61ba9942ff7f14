"""The ResourceSlice publisher as a pure function: tables for the shape, hypothesis for limits."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partkeeper.dra import DRIVER, devices, slices
from partkeeper.drivers import Card, Instance
from partkeeper.drivers.profiles import MODELS, model, overlaps
from tests_support import make_claim

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def card(index: int, name: str = "H100-80GB") -> Card:
    return Card(index, f"GPU-{index}", name, "partition", model(name).memory_mib)


def inst(card_index: int, profile: str, start: int, name: str = "H100-80GB") -> Instance:
    size = model(name).profiles[profile].size
    return Instance(card_index, profile, start, size, 1, 0, f"MIG-{card_index}-{start}")


def names(pool: slices.Pool) -> list[str]:
    return [d["name"] for d in pool.devices]


def test_empty_h100_offers_every_placement_smallest_first() -> None:
    pool = slices.pool("node-a", [card(0)], [], [])
    got = names(pool)
    assert got[:7] == [f"gpu-0-mig-1g10gb-{s}" for s in range(7)]
    assert got[-1] == "gpu-0-mig-7g80gb-0"
    assert len(got) == 7 + 4 + 3 + 2 + 1 + 1


def test_device_consumes_its_placements_memory_slices_and_compute() -> None:
    pool = slices.pool("node-a", [card(0)], [], [])
    dev = next(d for d in pool.devices if d["name"] == "gpu-0-mig-3g40gb-4")
    (use,) = dev["consumesCounters"]
    assert use["counterSet"] == "gpu-0"
    assert use["counters"] == {
        "memory-slice-4": {"value": "1"}, "memory-slice-5": {"value": "1"},
        "memory-slice-6": {"value": "1"}, "memory-slice-7": {"value": "1"},
        "compute-slices": {"value": "3"},
    }
    attrs = dev["attributes"]
    assert attrs[f"{DRIVER}/profile"] == {"string": "3g.40gb"}
    assert attrs[f"{DRIVER}/card"] == {"int": 0}
    assert attrs[f"{DRIVER}/start"] == {"int": 4}
    assert attrs[f"{DRIVER}/size"] == {"int": 4}
    assert attrs[f"{DRIVER}/model"] == {"string": "H100-80GB"}


def test_counter_set_per_card() -> None:
    (counters,) = slices.pool("node-a", [card(0)], [], []).counter_sets
    assert counters["name"] == "gpu-0"
    assert counters["counters"] == {
        **{f"memory-slice-{i}": {"value": "1"} for i in range(8)},
        "compute-slices": {"value": "7"},
    }


def test_each_card_s_counter_set_has_its_own_memory_slices_and_devices_consume_only_those() -> None:
    cards = [card(0, "DCU-64GB"), card(1, "PPU-96GB"), card(2, "H100-80GB")]
    objects = slices.slices(slices.pool("node-a", cards, [], []), 1)
    sets = {s["name"]: s["counters"] for o in objects for s in o["spec"].get("sharedCounters", [])}
    memory = {name: sorted(c for c in counters if c.startswith("memory-slice-"))
              for name, counters in sets.items()}
    assert memory == {f"gpu-{c.index}": sorted(f"memory-slice-{i}" for i in range(n))
                      for c, n in zip(cards, (4, 8, 8), strict=True)}
    assert {name: counters["compute-slices"] for name, counters in sets.items()} == {
        "gpu-0": {"value": "4"}, "gpu-1": {"value": "8"}, "gpu-2": {"value": "7"}}
    offered = [d for o in objects for d in o["spec"].get("devices", [])]
    assert {d["attributes"][f"{DRIVER}/model"]["string"] for d in offered} == {
        "DCU-64GB", "PPU-96GB", "H100-80GB"}
    for dev in offered:
        (use,) = dev["consumesCounters"]
        assert use["counterSet"] == f"gpu-{dev['attributes'][f'{DRIVER}/card']['int']}"
        assert set(use["counters"]) <= set(sets[use["counterSet"]]), dev["name"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_s_memory_slices_are_the_extent_of_its_placements(name: str) -> None:
    assert devices.memory_slices(name) == model(name).slices


@pytest.mark.parametrize(
    ("claims", "instances", "absent", "present"),
    [
        pytest.param([make_claim("a", 6, 1)], [], ["gpu-0-mig-1g10gb-6", "gpu-0-mig-7g80gb-0",
                     "gpu-0-mig-3g40gb-4", "gpu-0-mig-1g20gb-6"],
                     ["gpu-0-mig-3g40gb-0", "gpu-0-mig-1g10gb-5"], id="creating claim"),
        pytest.param([make_claim("a", 0, 4, state="releasing")], [],
                     ["gpu-0-mig-4g40gb-0", "gpu-0-mig-1g10gb-3"], ["gpu-0-mig-3g40gb-4"],
                     id="releasing claim"),
        pytest.param([], [inst(0, "1g.10gb", 0)], ["gpu-0-mig-1g10gb-0", "gpu-0-mig-2g20gb-0"],
                     ["gpu-0-mig-1g10gb-1", "gpu-0-mig-2g20gb-2"], id="foreign instance"),
        pytest.param([make_claim("a", 0, 8, state="active")], [], ["gpu-0-mig-1g10gb-0"], [],
                     id="whole card taken"),
        pytest.param([make_claim("a", 0, 2, card=1)], [], [], ["gpu-0-mig-1g10gb-0"],
                     id="another card's claim"),
    ],
)
def test_occupied_placements_are_never_offered(claims, instances, absent, present) -> None:
    got = set(names(slices.pool("node-a", [card(0)], claims, instances)))
    assert not got & set(absent)
    assert set(present) <= got


def test_device_names_parse_back_to_their_spec() -> None:
    cards = [card(0), card(1, "A100-40GB")]
    for spec in devices.all_devices(cards):
        assert devices.parse(spec.name, cards) == spec
    assert devices.parse("gpu-2-mig-1g10gb-0", cards) is None
    assert devices.parse("gpu-0-mig-1g10gb-7", cards) is None  # not a legal start
    assert devices.parse("gpu-0-mig-1g10gb-0; rm", cards) is None


def test_sliced_cards_offer_nothing() -> None:
    sliced = Card(0, "GPU-0", "A100-40GB", "sliced", 40960)
    assert slices.slices(slices.pool("node-a", [sliced], [], []), 1) == []


def test_generation_kept_when_unchanged_and_bumped_on_change() -> None:
    cards = [card(0)]
    empty = slices.pool("node-a", cards, [], [])
    published = slices.slices(empty, 5)
    assert slices.generation(published, empty) == 5
    taken = slices.pool("node-a", cards, [make_claim("a", 0, 1)], [])
    assert slices.generation(published, taken) == 6
    assert slices.generation([], empty) == 1


def test_generation_bumped_when_published_pool_is_incomplete() -> None:
    cards = [card(i) for i in range(9)]
    desired = slices.pool("node-a", cards, [], [])
    published = slices.slices(desired, 3)
    assert slices.generation(published[:-1], desired) == 4
    mixed = [*published[:-1], {**published[-1], "spec": {**published[-1]["spec"], "pool": {
        **published[-1]["spec"]["pool"], "generation": 2}}}]
    assert slices.generation(mixed, desired) == 4


placements = st.lists(
    st.tuples(st.integers(0, 9), st.sampled_from(sorted(model("H100-80GB").profiles)),
              st.integers(0, 6), st.booleans()),
    max_size=20,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 10), st.sampled_from(sorted(MODELS)), placements)
def test_slices_stay_within_the_api_limits_and_offer_exactly_the_free_room(
    ncards: int, model_name: str, taken: list[tuple[int, str, int, bool]]
) -> None:
    cards = [card(i, model_name) for i in range(ncards)]
    table = list(model(model_name).profiles.values())
    claims, instances = [], []
    for n, (index, _, start, physical) in enumerate(taken):
        if index >= ncards:
            continue
        profile = table[n % len(table)]
        start = profile.starts[start % len(profile.starts)]
        if physical:
            instances.append(Instance(index, profile.name, start, profile.size, n, 0, f"M{n}"))
        else:
            claims.append(make_claim(f"c{n}", start, profile.size, card=index))
    desired = slices.pool("node-a", cards, claims, instances)
    objects = slices.slices(desired, 7)
    counters = {s["name"]: s["counters"] for o in objects
                for s in o["spec"].get("sharedCounters", [])}
    covered = slices.occupied(claims, instances)
    sets: set[str] = set()
    offered: set[str] = set()
    for obj in objects:
        spec = obj["spec"]
        assert spec["driver"] == DRIVER and spec["nodeName"] == "node-a"
        assert spec["pool"] == {"name": "node-a", "generation": 7,
                                "resourceSliceCount": len(objects)}
        assert ("devices" in spec) != ("sharedCounters" in spec)
        assert len(spec.get("devices", [])) <= slices.MAX_DEVICES_PER_SLICE
        assert len(spec.get("sharedCounters", [])) <= slices.MAX_COUNTER_SETS_PER_SLICE
        sets |= {s["name"] for s in spec.get("sharedCounters", [])}
        for dev in spec.get("devices", []):
            assert DNS_LABEL.match(dev["name"]) and dev["name"] not in offered
            offered.add(dev["name"])
            (use,) = dev["consumesCounters"]
            assert set(use["counters"]) <= set(counters[use["counterSet"]])
    assert sets == {f"gpu-{i}" for i in range(ncards)}
    assert len({o["metadata"]["name"] for o in objects}) == len(objects)
    for spec in devices.all_devices(cards):
        free = not any(overlaps(spec.range, r) for r in covered.get(spec.card, ()))
        assert (spec.name in offered) == free


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(MODELS)), st.data())
def test_compute_counter_never_binds_tighter_than_the_slices(model_name: str, data) -> None:
    """Any set of non-overlapping legal placements fits the card's compute-slices counter, so
    the counter only ever refuses what the memory slices refuse too."""
    specs = devices.card_devices(card(0, model_name))
    chosen: list[devices.DeviceSpec] = []
    for spec in data.draw(st.permutations(specs)):
        if not any(overlaps(spec.range, c.range) for c in chosen):
            chosen.append(spec)
    assert sum(c.profile.compute_slices for c in chosen) <= devices.compute_capacity(model_name)
