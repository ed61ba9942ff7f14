"""Selectors, patch documents and Event views of the simulated API server, without HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from partkeeper_sim.apiserver import events, patch, selectors
from partkeeper_sim.apiserver.errors import BadRequest, Invalid
from partkeeper_sim.apiserver.store import Store, parse_rv
from tests_support.kubeclient import pod_manifest


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.mark.parametrize(
    ("field_selector", "label_selector", "expected"),
    [
        ("spec.nodeName=node-a", None, ["on-a", "on-a-web"]),
        ("spec.nodeName==node-b", None, ["on-b"]),
        ("spec.nodeName!=node-a", None, ["on-b", "unbound"]),
        ("spec.nodeName=", None, ["unbound"]),
        ("metadata.name=on-b", None, ["on-b"]),
        ("metadata.name=on-a,spec.nodeName=node-a", None, ["on-a"]),
        ("status.phase=Pending", None, ["on-a", "on-a-web", "on-b", "unbound"]),
        (None, "tier=web", ["on-a-web"]),
        (None, "tier!=web", ["on-a", "on-b", "unbound"]),
        (None, "tier", ["on-a-web"]),
        (None, "!tier", ["on-a", "on-b", "unbound"]),
        (None, "tier in (web, db)", ["on-a-web"]),
        (None, "tier notin (web)", ["on-a", "on-b", "unbound"]),
        ("spec.nodeName=node-a", "app=demo,tier=web", ["on-a-web"]),
    ],
)
def test_selectors(
    store: Store, field_selector: str | None, label_selector: str | None, expected: list[str]
) -> None:
    store.create("pods", "default", pod_manifest("on-a"))
    web = pod_manifest("on-a-web")
    web["metadata"]["labels"]["tier"] = "web"
    store.create("pods", "default", web)
    store.create("pods", "default", pod_manifest("on-b", node="node-b"))
    store.create("pods", "default", pod_manifest("unbound", node=None))
    selector = selectors.parse("pods", field_selector, label_selector)
    assert [p["metadata"]["name"] for p in store.list("pods", None, selector)[0]] == expected


@pytest.mark.parametrize(
    ("field_selector", "label_selector"),
    [("spec.containers=x", None), ("nonsense", None), (None, "a b c"), (None, "!x in (a)")],
)
def test_bad_selectors_are_bad_requests(
    field_selector: str | None, label_selector: str | None
) -> None:
    with pytest.raises(BadRequest):
        selectors.parse("pods", field_selector, label_selector)


@pytest.mark.parametrize(("text", "expected"), [(None, None), ("", None), ("0", None), ("7", 7)])
def test_parse_rv(text: str | None, expected: int | None) -> None:
    assert parse_rv(text) == expected


@pytest.mark.parametrize("text", ["abc", "-1", "1.5"])
def test_parse_rv_refuses_garbage(text: str) -> None:
    with pytest.raises(BadRequest):
        parse_rv(text)


# Patch documents and Event views ------------------------------------------------------------


@pytest.mark.parametrize(
    ("original", "document", "expected"),
    [
        ({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}, {"a": {"c": 2, "d": 3}}),
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
        ({"a": 1}, {"b": {"c": None}}, {"a": 1, "b": {}}),
    ],
)
def test_merge_patch(original: Any, document: Any, expected: Any) -> None:
    assert patch.apply("application/merge-patch+json", original, document) == expected


@pytest.mark.parametrize(
    ("operations", "expected"),
    [
        (
            [{"op": "add", "path": "/s/capacity/gpu~1x", "value": "1"}],
            {"s": {"capacity": {"gpu/x": "1"}}, "l": [1]},
        ),
        ([{"op": "replace", "path": "/l/0", "value": 9}], {"s": {"capacity": {}}, "l": [9]}),
        ([{"op": "add", "path": "/l/-", "value": 2}], {"s": {"capacity": {}}, "l": [1, 2]}),
        ([{"op": "remove", "path": "/l/0"}], {"s": {"capacity": {}}, "l": []}),
        (
            [
                {"op": "test", "path": "/l/0", "value": 1},
                {"op": "copy", "from": "/l", "path": "/m"},
            ],
            {"s": {"capacity": {}}, "l": [1], "m": [1]},
        ),
    ],
)
def test_json_patch(operations: list[Any], expected: Any) -> None:
    original = {"s": {"capacity": {}}, "l": [1]}
    assert patch.apply("application/json-patch+json", original, operations) == expected
    assert original == {"s": {"capacity": {}}, "l": [1]}


@pytest.mark.parametrize(
    ("content_type", "document", "error"),
    [
        ("application/json-patch+json", [{"op": "remove", "path": "/missing"}], Invalid),
        ("application/json-patch+json", [{"op": "test", "path": "/l/0", "value": 2}], Invalid),
        ("application/json-patch+json", {"not": "a list"}, BadRequest),
        ("application/merge-patch+json", [1], BadRequest),
        ("text/plain", {}, Exception),
    ],
)
def test_bad_patches(content_type: str, document: Any, error: type) -> None:
    with pytest.raises(error):
        patch.apply(content_type, {"l": [1]}, document)


def test_event_views_round_trip() -> None:
    group = {
        "metadata": {"name": "e"},
        "eventTime": "2024-05-01T12:00:00.000000Z",
        "regarding": {"kind": "Pod", "name": "p"},
        "note": "allocated",
        "reason": "Allocated",
        "type": "Normal",
        "action": "Allocate",
        "reportingController": "partkeeper",
        "reportingInstance": "node-a",
    }
    core = events.to_core(group)
    assert core["involvedObject"] == {"kind": "Pod", "name": "p"}
    assert core["message"] == "allocated" and core["apiVersion"] == "v1"
    back = events.from_core(core)
    assert {k: back[k] for k in group} == group
    assert back["apiVersion"] == "events.k8s.io/v1"
    assert (
        events.core_field_selector("regarding.name=p,reason=R") == "involvedObject.name=p,reason=R"
    )
