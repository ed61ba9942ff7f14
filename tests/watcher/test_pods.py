"""Reading Pod objects strictly: what counts as ours, and every way an object is refused."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import ContainerRequest
from services.watcher.pods import MalformedPod, Resources, identity, object_rv, parse_pod

NODE = "node-a"
UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
OURS = Resources("nvidia.com/mig-", "nvidia.com/gpu.sliced")
_DROP = object()


def pod(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": "p", "namespace": "ns", "uid": UID, "resourceVersion": "7",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}},
            ],
        },
        "status": {"phase": "Pending"},
    }
    for path, value in changes.items():
        target = body
        *parents, leaf = path.split("__")
        for part in parents:
            target = target[part]
        if value is _DROP:
            target.pop(leaf)
        else:
            target[leaf] = value
    return body


def test_a_well_formed_pod() -> None:
    facts = parse_pod(pod(), node=NODE, resources=OURS)
    assert (facts.uid, facts.where, facts.phase, facts.rv) == (UID, "ns/p", "Pending", 7)
    assert facts.containers == (ContainerRequest(name="main",
                                                 requests={"nvidia.com/mig-1g.10gb": 1}),)
    assert not facts.deleting and not facts.terminal


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"limits": {"nvidia.com/mig-1g.10gb": "2"}}, {"nvidia.com/mig-1g.10gb": 2}),
        ({"requests": {"nvidia.com/mig-1g.10gb": "1"}}, {"nvidia.com/mig-1g.10gb": 1}),
        # The limit is what counts for an extended resource.
        ({"limits": {"nvidia.com/mig-1g.10gb": "2"}, "requests": {"nvidia.com/mig-1g.10gb": "1"}},
         {"nvidia.com/mig-1g.10gb": 2}),
        ({"limits": {"nvidia.com/gpu.sliced": 1}}, {"nvidia.com/gpu.sliced": 1}),
        ({"limits": {"nvidia.com/gpu": "1", "cpu": "500m"}}, {}),
        ({"limits": {"nvidia.com/mig-1g.10gb": "0"}}, {}),
        ({}, {}),
        (None, {}),
    ],
)
def test_requests_of_our_resources(resources: Any, expected: dict[str, int]) -> None:
    body = pod()
    body["spec"]["containers"][0]["resources"] = resources
    facts = parse_pod(body, node=NODE, resources=OURS)
    assert facts.containers[0].requests == expected


def test_init_containers_come_first() -> None:
    body = pod()
    body["spec"]["initContainers"] = [
        {"name": "init", "resources": {"limits": {"nvidia.com/mig-2g.20gb": "1"}}}
    ]
    facts = parse_pod(body, node=NODE, resources=OURS)
    assert [c.name for c in facts.containers] == ["init", "main"]
    assert facts.containers[0].requests == {"nvidia.com/mig-2g.20gb": 1}


@pytest.mark.parametrize(
    ("phase", "deleting", "terminal"),
    [("Pending", False, False), ("Running", True, False), ("Unknown", False, False),
     ("Succeeded", False, True), ("Failed", True, True)],
)
def test_phase_and_deletion(phase: str, deleting: bool, terminal: bool) -> None:
    body = pod(status__phase=phase)
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:30Z"
    facts = parse_pod(body, node=NODE, resources=OURS)
    assert (facts.deleting, facts.terminal) == (deleting, terminal)


MALFORMED: list[tuple[str, Any, str]] = [
    ("not an object", "a string", "not a JSON object"),
    ("a list", [1, 2], "not a JSON object"),
    ("no metadata", {"spec": {}}, "no metadata"),
    ("no uid", pod(metadata__uid=_DROP), "UID"),
    ("path in uid", pod(metadata__uid="../../etc/passwd"), "UID"),
    ("upper-case uid", pod(metadata__uid=UID.upper()), "UID"),
    ("uid with wildcard", pod(metadata__uid="0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5*"), "UID"),
    ("numeric uid", pod(metadata__uid=12), "UID"),
    ("no name", pod(metadata__name=_DROP), "namespace and name"),
    ("no namespace", pod(metadata__namespace=""), "namespace and name"),
    ("no resourceVersion", pod(metadata__resourceVersion=_DROP), "resourceVersion"),
    ("opaque resourceVersion", pod(metadata__resourceVersion="abc"), "resourceVersion"),
    ("no spec", pod(spec=_DROP), "spec or status"),
    ("status a string", pod(status="Running"), "spec or status"),
    ("other node", pod(spec__nodeName="node-b"), "bound to"),
    ("unbound", pod(spec__nodeName=_DROP), "bound to"),
    ("odd phase", pod(status__phase="Exploded"), "phase"),
    ("no phase", pod(status__phase=_DROP), "phase"),
    ("no containers", pod(spec__containers=[]), "containers"),
    ("container without name", pod(spec__containers=[{"image": "x"}]), "no name"),
    ("repeated names", pod(spec__containers=[{"name": "a"}, {"name": "a"}]), "repeat"),
    ("resources a list", pod(spec__containers=[{"name": "a", "resources": []}]), "not an object"),
    ("fractional quantity",
     pod(spec__containers=[{"name": "a", "resources": {"limits": {"nvidia.com/mig-x": "0.5"}}}]),
     "asks for"),
    ("negative quantity",
     pod(spec__containers=[{"name": "a", "resources": {"limits": {"nvidia.com/mig-x": -1}}}]),
     "asks for"),
    ("boolean quantity",
     pod(spec__containers=[{"name": "a", "resources": {"limits": {"nvidia.com/mig-x": True}}}]),
     "asks for"),
    ("created not a string", pod(metadata__creationTimestamp=5), "creationTimestamp"),
]


@pytest.mark.parametrize(("obj", "fragment"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_objects_are_refused_with_a_reason(obj: Any, fragment: str) -> None:
    with pytest.raises(MalformedPod) as refused:
        parse_pod(copy.deepcopy(obj), node=NODE, resources=OURS)
    assert fragment in str(refused.value)


def test_the_refusal_names_the_pod_when_it_can() -> None:
    with pytest.raises(MalformedPod) as refused:
        parse_pod(pod(status__phase="Exploded"), node=NODE, resources=OURS)
    assert refused.value.uid == UID and refused.value.where == "ns/p"
    assert UID in str(refused.value) and "ns/p" in str(refused.value)


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20,
))
def test_any_json_value_is_read_or_refused_never_crashes(obj: Any) -> None:
    with contextlib.suppress(MalformedPod):
        parse_pod(obj, node=NODE, resources=OURS)
    identity(obj)
    object_rv(obj)
