"""Pure parts of the simulated kubelet: Pod parsing, device choice, shortage, relisting."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from partkeeper_sim.kubelet import PodSpecError, choose, natural_key, pod_from_manifest
from partkeeper_sim.kubelet.admission import device_requests, find_shortage
from partkeeper_sim.kubelet.cluster import relist_events
from partkeeper_sim.kubelet.pods import PodView, is_extended_resource, pod_manifest

R = "nvidia.com/mig-1g.10gb"


def manifest(resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"uid": "u", "name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "main", "resources": resources}]},
    }


@pytest.mark.parametrize(
    ("resources", "devices"),
    [
        ({"limits": {R: "2", "cpu": "1", "memory": "1Gi"}}, {R: 2}),
        ({"requests": {R: "1"}}, {R: 1}),
        ({"limits": {R: "0"}}, {}),
        ({"limits": {"hugepages-2Mi": "2Mi", "kubernetes.io/x": "1"}}, {}),
        ({}, {}),
    ],
)
def test_pod_from_manifest_reads_extended_resources(
    resources: dict[str, Any], devices: dict[str, int]
) -> None:
    pod = pod_from_manifest(manifest(resources))
    assert (pod.uid, pod.key, pod.phase, pod.deletion_requested) == ("u", "ns/p", "Pending", False)
    assert dict(pod.containers[0].devices) == devices


@pytest.mark.parametrize(
    "bad",
    [
        {"metadata": {"name": "p"}, "spec": {}},
        manifest({"limits": {R: "1.5"}}),
        manifest({"limits": {R: "500m"}}),
        {"metadata": {"uid": "u", "name": "p"}, "spec": {"containers": [{"resources": {}}]}},
    ],
)
def test_pod_from_manifest_refuses_malformed_pods(bad: dict[str, Any]) -> None:
    with pytest.raises(PodSpecError):
        pod_from_manifest(bad)


def test_pod_from_manifest_reads_what_the_kubernetes_client_serializes() -> None:
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="p", namespace="ns", uid="u", deletion_timestamp="2030-01-01T00:00:00Z"
        ),
        spec=client.V1PodSpec(
            node_name="node-a",
            containers=[
                client.V1Container(
                    name="main", resources=client.V1ResourceRequirements(limits={R: "1"})
                )
            ],
        ),
        status=client.V1PodStatus(phase="Running"),
    )
    raw = client.ApiClient().sanitize_for_serialization(pod)
    view = pod_from_manifest(raw)
    assert (view.node, view.phase, view.deletion_requested) == ("node-a", "Running", True)
    assert dict(view.containers[0].devices) == {R: 1}


@pytest.mark.parametrize(
    ("name", "extended"),
    [
        (R, True),
        ("example.com/foo", True),
        ("cpu", False),
        ("nvidia.com", False),
        ("kubernetes.io/foo", False),
        ("node.kubernetes.io/foo", False),
        ("requests.a/b", False),
    ],
)
def test_is_extended_resource(name: str, extended: bool) -> None:
    assert is_extended_resource(name) is extended


@pytest.mark.parametrize(
    ("available", "count", "preferred", "chosen"),
    [
        (["d10", "d2", "d1"], 2, [], ["d1", "d2"]),
        (["d0", "d1", "d2"], 2, ["d2"], ["d2", "d0"]),
        (["d0", "d1"], 1, ["gone", "d1"], ["d1"]),
        (["d0", "d1"], 2, ["d1", "d1"], ["d1", "d0"]),
        (["a"], 0, [], []),
    ],
)
def test_choose(available: list[str], count: int, preferred: list[str], chosen: list[str]) -> None:
    assert choose(available, count, preferred) == chosen


def test_choose_refuses_more_than_available() -> None:
    with pytest.raises(ValueError, match="3 devices wanted, 2 available"):
        choose(["a", "b"], 3)


def test_natural_key_orders_numbers_by_value() -> None:
    ids = ["mig-1g-10", "mig-1g-2", "mig-1g-1", "gpu-b", "gpu-a"]
    assert sorted(ids, key=natural_key) == ["gpu-a", "gpu-b", "mig-1g-1", "mig-1g-2", "mig-1g-10"]


def test_shortage_counts_the_whole_pod_against_healthy_free_devices() -> None:
    pod = pod_from_manifest(pod_manifest("p", "u", {"a": {R: 1}, "b": {R: 2}}))
    requests = device_requests(pod)
    assert [(r.container, r.count) for r in requests] == [("a", 1), ("b", 2)]
    healthy = {R: ["d0", "d1", "d2", "d3"]}
    assert find_shortage(requests, healthy, {R: {"d0"}}) is None
    shortage = find_shortage(requests, healthy, {R: {"d0", "d1", "x-unhealthy"}})
    assert shortage is not None
    assert (shortage.reason, shortage.requested, shortage.used, shortage.capacity) == (
        f"OutOf{R}",
        3,
        2,
        4,
    )


def view(uid: str, created: str, name: str) -> PodView:
    return PodView(uid=uid, namespace="ns", name=name, created=created)


def test_relist_reports_vanished_pods_and_orders_the_rest_oldest_first() -> None:
    known = {"gone": view("gone", "2024-01-01T00:00:00Z", "g")}
    listed = [
        view("new", "2024-01-03T00:00:00Z", "a"),
        view("old", "2024-01-02T00:00:00Z", "z"),
    ]
    events = relist_events(known, listed)
    assert [(e.kind, e.pod.uid) for e in events] == [
        ("deleted", "gone"),
        ("upsert", "old"),
        ("upsert", "new"),
    ]
    assert set(known) == {"new", "old"}
