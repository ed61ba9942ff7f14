"""The simulated scheduler's structured allocator over the publisher's slices (both pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partkeeper.dra import DRIVER, devices, slices
from partkeeper.drivers import Card, Instance
from partkeeper.drivers.profiles import model, overlaps
from partkeeper_sim.scheduler import allocate as alloc
from partkeeper_sim.scheduler import cel
from schemas import Claim

NODE = "node-a"
CLASSES = {DRIVER: {"spec": {"selectors": [{"cel": {"expression":
                                                    f'device.driver == "{DRIVER}"'}}]}}}
H100 = sorted(model("H100-80GB").profiles)


def card(index: int) -> Card:
    return Card(index, f"GPU-{index}", "H100-80GB", "partition", 81920)


def named(device: str, cards: list[Card]) -> devices.DeviceSpec:
    """The spec `device` names on `cards`, failing the test where it names none of them."""
    spec = devices.parse(device, cards)
    if spec is None:
        raise AssertionError(f"{device} names no device of cards {[c.index for c in cards]}")
    return spec


def request(name: str, profile: str, count: int = 1) -> dict:
    selector = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [{
        "name": "mig", "exactly": {"deviceClassName": DRIVER, "count": count,
                                   "selectors": [{"cel": {"expression": selector}}]}}]}}}


def allocated(name: str, device: str) -> dict:
    return {"metadata": {"name": name}, "status": {"allocation": {"devices": {"results": [
        {"request": "mig", "driver": DRIVER, "pool": NODE, "device": device}]}}}}


def claim(cid: str, spec: devices.DeviceSpec) -> Claim:
    return Claim(id=cid, state="active", pod_uid="u", namespace="d", name="p", container="mig",
                 resource=DRIVER, device_ids=[spec.name], card=spec.card,
                 profile=spec.profile.name, start=spec.start, size=spec.size, created_at=0,
                 updated_at=0)


def published(cards, claims=(), instances=(), generation=1):
    return alloc.complete_pools(slices.slices(slices.pool(NODE, cards, claims, instances),
                                              generation))


def test_first_fit_takes_the_smallest_device_in_slice_order() -> None:
    inv = published([card(0), card(1)])
    got = alloc.allocate(inv, CLASSES, [allocated("x", "gpu-0-mig-1g10gb-0")],
                         [request("a", "1g.10gb")])
    assert got["a"] == [{"request": "mig", "driver": DRIVER, "pool": NODE,
                         "device": "gpu-0-mig-1g10gb-1"}]


def test_7g_and_1g_on_one_card_never_both() -> None:
    inv = published([card(0)])
    big = alloc.allocate(inv, CLASSES, [], [request("a", "7g.80gb")])
    assert big["a"][0]["device"] == "gpu-0-mig-7g80gb-0"
    with pytest.raises(alloc.Unsatisfiable):
        alloc.allocate(inv, CLASSES, [allocated("a", "gpu-0-mig-7g80gb-0")],
                       [request("b", "1g.10gb")])
    small = alloc.allocate(inv, CLASSES, [], [request("b", "1g.10gb")])
    assert small["b"][0]["device"] == "gpu-0-mig-1g10gb-0"
    with pytest.raises(alloc.Unsatisfiable):
        alloc.allocate(inv, CLASSES, [allocated("b", "gpu-0-mig-1g10gb-0")],
                       [request("a", "7g.80gb")])


def test_all_or_nothing_across_the_claims_of_a_pod() -> None:
    inv = published([card(0)])
    with pytest.raises(alloc.Unsatisfiable):
        alloc.allocate(inv, CLASSES, [], [request("a", "4g.40gb"), request("b", "4g.40gb")])
    two = alloc.allocate(inv, CLASSES, [], [request("a", "3g.40gb", count=2)])
    assert [r["device"] for r in two["a"]] == ["gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"]


def test_incomplete_pools_are_not_used() -> None:
    objects = slices.slices(slices.pool(NODE, [card(0)], [], []), 3)
    assert alloc.complete_pools(objects[1:]).devices == []
    newer = slices.slices(slices.pool(NODE, [card(0)], [], []), 4)
    assert alloc.complete_pools([*objects, newer[0]]).devices == []
    assert len(alloc.complete_pools([*objects, *newer]).devices) == 18


@pytest.mark.parametrize(("expression", "expected"), [
    (f'device.driver == "{DRIVER}"', True),
    (f'device.driver != "{DRIVER}"', False),
    (f'device.attributes["{DRIVER}"].profile == "1g.10gb"', True),
    (f'device.attributes["{DRIVER}"].card == 0 && device.attributes["{DRIVER}"].start == 6',
     True),
    (f'device.attributes["{DRIVER}"].size == 2', False),
    ('device.attributes["other.io"].profile == "1g.10gb"', False),
])
def test_cel_subset(expression: str, expected: bool) -> None:
    dev = slices.device(named("gpu-0-mig-1g10gb-6", [card(0)]))
    assert cel.matches(expression, dev, DRIVER) is expected


def test_cel_outside_the_subset_is_refused() -> None:
    with pytest.raises(cel.SelectorError):
        cel.matches("device.capacity['x'].memory.compareTo(quantity('1Gi')) >= 0", {}, DRIVER)


ops = st.lists(st.tuples(st.sampled_from(["claim", "prepare", "delete", "destroy", "carve"]),
                         st.integers(0, 50), st.sampled_from(H100)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 2), ops)
def test_random_mixes_never_over_admit(ncards: int, steps) -> None:
    """Claims come and go with the publisher's slices in between: every allocation fits beside
    every other allocation and every partition, so a prepare never fails for room."""
    cards = [card(i) for i in range(ncards)]
    alloc_of: dict[str, devices.DeviceSpec] = {}  # allocated claims -> device
    prepared: set[str] = set()
    releasing: list[devices.DeviceSpec] = []  # deallocated, partition not yet destroyed
    foreign: list[Instance] = []
    generation = 0
    for n, (op, pick, profile) in enumerate(steps):
        partitions = [alloc_of[c] for c in prepared] + releasing
        if op == "claim":
            generation += 1
            inv = published(cards, [claim(f"p{i}", s) for i, s in enumerate(partitions)],
                            foreign, generation)
            current = [allocated(c, s.name) for c, s in alloc_of.items()]
            try:
                got = alloc.allocate(inv, CLASSES, current, [request(f"c{n}", profile)])
            except alloc.Unsatisfiable:
                continue
            spec = named(got[f"c{n}"][0]["device"], cards)
            others = [alloc_of[c] for c in alloc_of] + releasing
            taken = [s.range for s in others if s.card == spec.card]
            taken += [i.placement for i in foreign if i.card == spec.card]
            assert not any(overlaps(spec.range, t) for t in taken), (spec, others, foreign)
            alloc_of[f"c{n}"] = spec
        elif op == "prepare" and alloc_of:
            prepared.add(sorted(alloc_of)[pick % len(alloc_of)])
        elif op == "delete" and alloc_of:
            name = sorted(alloc_of)[pick % len(alloc_of)]
            spec = alloc_of.pop(name)
            if name in prepared:
                prepared.discard(name)
                releasing.append(spec)
        elif op == "destroy" and releasing:
            releasing.pop(pick % len(releasing))
        elif op == "carve":
            busy = [*alloc_of.values(), *releasing]
            for spec in devices.all_devices(cards):
                if spec.profile.name != profile:
                    continue
                if any(s.card == spec.card and overlaps(spec.range, s.range) for s in busy):
                    continue
                if any(i.card == spec.card and overlaps(spec.range, i.placement)
                       for i in foreign):
                    continue
                foreign.append(Instance(spec.card, profile, spec.start, spec.size, 90 + n, 0,
                                        f"F{n}"))
                break
