"""The publisher's small decisions, pure: what counts as a change of the pool, which watch
events are somebody else's, when the server dropped the counters, what a container gets."""

from __future__ import annotations

import copy

import pytest

from partkeeper.dra import DRIVER, slices
from partkeeper.drivers import Card
from partkeeper.kubelet import dra_pb2
from partkeeper_sim.kubelet.draclaims import cdi_devices
from services.allocator.dra.publish import counters_dropped
from services.allocator.dra.slicewatch import foreign

H100 = Card(0, "GPU-0", "H100-80GB", "partition", 81920)
OWNER = {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "u-1", "controller": True}


def pool() -> slices.Pool:
    return slices.pool("node-a", [H100], [], [], owner=OWNER)


def as_answered(objects: list[dict]) -> list[dict]:
    """What the server answers: canonical quantities, a resourceVersion."""
    out = copy.deepcopy(objects)
    for obj in out:
        obj["metadata"]["resourceVersion"] = "7"
        for device in obj["spec"].get("devices") or []:
            capacity = device["capacity"][f"{DRIVER}/memory"]
            capacity["value"] = {"10Gi": "10240Mi"}.get(capacity["value"], capacity["value"])
    return out


def test_a_spelling_of_the_same_quantity_is_no_change() -> None:
    current = as_answered(slices.slices(pool(), 3))
    assert slices.generation(current, pool()) == 3


def test_a_missing_owner_is_a_change() -> None:
    current = slices.slices(slices.pool("node-a", [H100], [], []), 3)  # an older version's
    assert slices.generation(current, pool()) == 4


def test_slices_carry_the_node_as_controller_owner() -> None:
    for body in slices.slices(pool(), 1):
        assert body["metadata"]["ownerReferences"] == [OWNER]


@pytest.mark.parametrize(("event", "intended", "theirs"), [
    ("DELETED", True, True),  # kubelet's wipe
    ("DELETED", False, False),  # our own delete
    ("MODIFIED", True, False),  # our own write, before or after its answer
    ("ADDED", False, True),
    ("BOOKMARK", True, False),
])
def test_foreign_events(event: str, intended: bool, theirs: bool) -> None:
    body = slices.slices(pool(), 1)[1]
    sent = {body["metadata"]["name"]: body} if intended else {}
    assert foreign(event, as_answered([body])[0], sent) is theirs


def test_an_edited_slice_is_foreign() -> None:
    body = slices.slices(pool(), 1)[1]
    edited = copy.deepcopy(body)
    edited["spec"]["devices"].pop()
    assert foreign("MODIFIED", edited, {body["metadata"]["name"]: body})


def test_dropped_counters_are_seen_in_the_answer() -> None:
    counters, devices = slices.slices(pool(), 1)
    assert not counters_dropped(counters, copy.deepcopy(counters))
    assert counters_dropped(counters, {**counters, "spec": {**counters["spec"],
                                                            "sharedCounters": None}})
    stripped = copy.deepcopy(devices)
    for device in stripped["spec"]["devices"]:
        device.pop("consumesCounters")
    assert counters_dropped(devices, stripped)
    assert not counters_dropped(devices, copy.deepcopy(devices))


def test_a_container_gets_the_devices_of_its_top_level_request() -> None:
    top = dra_pb2.Device(request_names=["gpu"], cdi_device_ids=["k/c=1"])
    sub = dra_pb2.Device(request_names=["gpu/p0"], cdi_device_ids=["k/c=2"])
    unnamed = dra_pb2.Device(cdi_device_ids=["k/c=3"])
    assert cdi_devices([top, sub], "gpu") == ["k/c=1"]
    assert cdi_devices([top, sub], "") == ["k/c=1", "k/c=2"]
    assert cdi_devices([sub, unnamed], "gpu") == ["k/c=3"], "no names: matches any request"
