"""The simulated API server takes ResourceSlices as kube-apiserver 1.35/1.36 does: the v1
validation limits, canonical quantities, and the DRAPartitionableDevices gate, through the real
client (the Go limits: k8s.io/kubernetes pkg/apis/resource/types.go)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from partkeeper.dra import DRIVER, slices
from partkeeper.drivers import Card

H100 = Card(0, "GPU-0", "H100-80GB", "partition", 81920)
Body = dict[str, Any]


def published() -> tuple[Body, Body]:
    counters, devices = slices.slices(slices.pool("node-a", [H100], [], []), 1)
    return counters, devices


def _many_devices(body: Body, n: int, consuming: bool) -> Body:
    first = body["spec"]["devices"][0]
    made = []
    for i in range(n):
        device = copy.deepcopy(first)
        device["name"] = f"d-{i}"
        if not consuming:
            device.pop("consumesCounters")
        made.append(device)
    body["spec"]["devices"] = made
    return body


def _set(body: Body, target: Body, key: str, value: Any) -> Body:
    """`body` after `target[key] = value` (`target` lies inside `body`): a spoiler in one
    expression."""
    target[key] = value
    return body


def _device(body: Body) -> Body:
    device: Body = body["spec"]["devices"][0]
    return device


BAD: list[tuple[str, str, Callable[[Body, Body], Body]]] = [
    ("devices and counters", "only one of", lambda c, d: {
        **d, "spec": {**d["spec"], "sharedCounters": c["spec"]["sharedCounters"]}}),
    ("65 consuming devices", "at most 64", lambda c, d: _many_devices(d, 65, True)),
    ("129 devices", "at most 128", lambda c, d: _many_devices(d, 129, False)),
    ("9 counter sets", "at most 8", lambda c, d: {**c, "spec": {**c["spec"], "sharedCounters": [
        {"name": f"s-{i}", "counters": {"x": {"value": "1"}}} for i in range(9)]}}),
    ("33 counters in a set", "at most 32", lambda c, d: {**c, "spec": {**c["spec"],
        "sharedCounters": [{"name": "s", "counters": {
            f"c-{i}": {"value": "1"} for i in range(33)}}]}}),
    ("3 consumptions", "at most 2", lambda c, d: _set(d, _device(d), "consumesCounters", [
        {"counterSet": f"s-{i}", "counters": {"x": {"value": "1"}}} for i in range(3)])),
    ("33 attributes and capacities", "must not exceed 32", lambda c, d: (
        _device(d)["attributes"].update(
            {f"{DRIVER}/a{i}": {"int": i} for i in range(28)}), d)[1]),
    ("a device name that is no DNS label", "DNS label",
     lambda c, d: _set(d, _device(d), "name", "GPU_0")),
    ("a counter name that is no DNS label", "DNS label", lambda c, d: (
        c["spec"]["sharedCounters"][0]["counters"].__setitem__("Memory.0", {"value": "1"}),
        c)[1]),
    ("an unqualified attribute name", "qualified name", lambda c, d: (
        _device(d)["attributes"].__setitem__("bad name", {"int": 1}), d)[1]),
    ("an identifier over 32 characters", "qualified name", lambda c, d: (
        _device(d)["attributes"].__setitem__(f"{DRIVER}/{'x' * 33}", {"int": 1}), d)[1]),
    ("an unreadable quantity", "quantity", lambda c, d: (
        _device(d)["capacity"].__setitem__(f"{DRIVER}/memory", {"value": "ten"}), d)[1]),
    ("a slice name that is no DNS subdomain", "metadata.name", lambda c, d: (
        d["metadata"].__setitem__("name", "Node_A"), d)[1]),
    ("a driver name that is no DNS subdomain", "spec.driver", lambda c, d: (
        d["spec"].__setitem__("driver", "Partitions"), d)[1]),
    ("a zero resourceSliceCount", "resourceSliceCount", lambda c, d: (
        d["spec"]["pool"].__setitem__("resourceSliceCount", 0), d)[1]),
]


@pytest.mark.parametrize(("what", "said", "spoil"), BAD, ids=[b[0] for b in BAD])
def test_invalid_slices_are_refused_and_nothing_is_stored(
    resource_api: client.ResourceV1Api, what: str, said: str,
    spoil: Callable[[Body, Body], Body],
) -> None:
    body = spoil(*published())
    with pytest.raises(ApiException) as raised:
        resource_api.create_resource_slice(body)
    assert raised.value.status == 422, what
    assert said in raised.value.body
    assert resource_api.list_resource_slice().items == []


def test_an_update_is_validated_too(resource_api: client.ResourceV1Api) -> None:
    _, devices = published()
    made = resource_api.create_resource_slice(devices)
    devices["metadata"]["resourceVersion"] = made.metadata.resource_version
    _many_devices(devices, 65, True)
    with pytest.raises(ApiException) as raised:
        resource_api.replace_resource_slice(devices["metadata"]["name"], devices)
    assert raised.value.status == 422


def test_quantities_come_back_canonical_and_a_same_value_update_writes_nothing(
    resource_api: client.ResourceV1Api,
) -> None:
    _, devices = published()
    _device(devices)["capacity"][f"{DRIVER}/memory"] = {"value": "10240Mi"}
    made = resource_api.create_resource_slice(devices)
    assert made.spec.devices[0].capacity[f"{DRIVER}/memory"].value == "10Gi"
    devices["metadata"]["resourceVersion"] = made.metadata.resource_version
    again = resource_api.replace_resource_slice(devices["metadata"]["name"], devices)
    assert again.metadata.resource_version == made.metadata.resource_version


def test_with_the_gate_off_the_counter_fields_are_dropped_silently(
    resource_api: client.ResourceV1Api, apiserver,
) -> None:
    apiserver.with_store(lambda store: setattr(store, "partitionable_devices", False))
    counters, devices = published()
    kept_counters = resource_api.create_resource_slice(counters)
    kept_devices = resource_api.create_resource_slice(devices)
    assert not kept_counters.spec.shared_counters
    assert kept_devices.spec.devices and not any(
        d.consumes_counters for d in kept_devices.spec.devices)
