"""The simulated API server's store, selectors and patches, without HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from partkeeper_sim.apiserver import selectors
from partkeeper_sim.apiserver.errors import (
    AlreadyExists,
    Conflict,
    Expired,
    Invalid,
    NotFound,
)
from partkeeper_sim.apiserver.store import Change, Store
from tests_support.kubeclient import pod_manifest

EVERYTHING = selectors.Selector()
NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> Store:
    return Store(clock=clock)


def recorded(store: Store) -> list[Change]:
    changes: list[Change] = []
    store.subscribe(changes.append)
    return changes


def test_create_assigns_identity_defaults_and_versions(store: Store) -> None:
    first = store.create("pods", "default", pod_manifest("a"))
    second = store.create("pods", "other", pod_manifest("a"))

    meta = first["metadata"]
    assert meta["namespace"] == "default"
    assert len(meta["uid"]) == 36 and meta["uid"] != second["metadata"]["uid"]
    assert meta["creationTimestamp"] == "2024-05-01T12:00:00Z"
    assert first["status"]["phase"] == "Pending"
    assert first["spec"]["terminationGracePeriodSeconds"] == 30
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert (first["kind"], first["apiVersion"]) == ("Pod", "v1")


def test_create_ignores_client_set_system_metadata(store: Store) -> None:
    body = pod_manifest("a")
    body["metadata"].update(uid="../../etc", resourceVersion="999", namespace="default")
    created = store.create("pods", "default", body)
    assert created["metadata"]["uid"] != "../../etc"
    assert created["metadata"]["resourceVersion"] != "999"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"metadata": {}, "spec": {"containers": [{"name": "c"}]}}, Invalid),
        ({"metadata": {"name": "x"}}, Invalid),
        ({"metadata": {"name": "x"}, "spec": {"containers": []}}, Invalid),
        ({"metadata": {"name": "x"}, "spec": {"containers": [{"image": "i"}]}}, Invalid),
    ],
)
def test_create_refuses_invalid_pods(store: Store, body: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        store.create("pods", "default", body)
    assert store.list("pods", None, EVERYTHING)[0] == []


def test_create_duplicate_is_already_exists_and_generate_name_is_unique(store: Store) -> None:
    store.create("pods", "default", pod_manifest("a"))
    with pytest.raises(AlreadyExists):
        store.create("pods", "default", pod_manifest("a"))
    generated = {"metadata": {"generateName": "w-"}, "spec": pod_manifest("x")["spec"]}
    names = {store.create("pods", "default", generated)["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("w-") for n in names)


def test_get_missing_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound) as raised:
        store.get("pods", "default", "nope")
    assert raised.value.status()["code"] == 404


def test_returned_objects_are_copies(store: Store) -> None:
    created = store.create("pods", "default", pod_manifest("a"))
    created["metadata"]["labels"]["app"] = "changed"
    store.get("pods", "default", "a")["spec"]["nodeName"] = "elsewhere"
    assert store.get("pods", "default", "a")["metadata"]["labels"]["app"] == "demo"
    assert store.get("pods", "default", "a")["spec"]["nodeName"] == "node-a"


def test_list_is_ordered_and_carries_the_collection_version(store: Store) -> None:
    for ns, name in [("b", "z"), ("a", "y"), ("a", "x")]:
        store.create("pods", ns, pod_manifest(name))
    items, rv = store.list("pods", None, EVERYTHING)
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in items] == [
        ("a", "x"),
        ("a", "y"),
        ("b", "z"),
    ]
    newest = max(int(i["metadata"]["resourceVersion"]) for i in items)
    assert rv == str(store.resource_version) == str(newest)
    assert [i["metadata"]["name"] for i in store.list("pods", "a", EVERYTHING)[0]] == ["x", "y"]


# History, resume and compaction -------------------------------------------------------------


def test_changes_since_replays_later_changes_in_order(store: Store) -> None:
    _, start = store.list("pods", None, EVERYTHING)
    store.create("pods", "default", pod_manifest("a"))
    store.create("nodes", "", {"metadata": {"name": "node-a"}})
    store.patch(
        "pods", "default", "a", "application/merge-patch+json", {"metadata": {"labels": {"x": "1"}}}
    )
    store.delete("pods", "default", "a", {"gracePeriodSeconds": 0})

    changes = store.changes_since("pods", int(start))
    assert [c.type for c in changes] == ["ADDED", "MODIFIED", "DELETED"]
    versions = [c.rv for c in changes]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert [c.obj["metadata"]["resourceVersion"] for c in changes] == [str(v) for v in versions]
    assert store.changes_since("pods", versions[1]) == changes[2:]
    assert store.changes_since("pods", store.resource_version) == []


def test_compaction_expires_older_versions_only(store: Store) -> None:
    store.create("pods", "default", pod_manifest("a"))
    before = store.resource_version
    compacted = store.compact()
    with pytest.raises(Expired) as raised:
        store.changes_since("pods", before - 1)
    assert raised.value.status()["code"] == 410 and raised.value.reason == "Expired"
    assert store.changes_since("pods", compacted) == []
    store.create("pods", "default", pod_manifest("b"))
    assert [c.obj["metadata"]["name"] for c in store.changes_since("pods", compacted)] == ["b"]


def test_history_limit_drops_the_oldest(clock: Clock) -> None:
    store = Store(history_limit=2, clock=clock)
    start = store.resource_version
    for name in "abc":
        store.create("pods", "default", pod_manifest(name))
    with pytest.raises(Expired):
        store.changes_since("pods", start)
    assert [c.obj["metadata"]["name"] for c in store.changes_since("pods", start + 1)] == ["b", "c"]


def test_selector_transitions_are_added_and_deleted(store: Store) -> None:
    """A Pod bound to the watched node enters the selection (ADDED); one whose labels stop
    matching leaves it (DELETED), as the real watch cache reports them."""
    changes = recorded(store)
    on_node = selectors.parse("pods", "spec.nodeName=node-a", None)
    by_label = selectors.parse("pods", None, "app=demo")
    store.create("pods", "default", pod_manifest("p", node=None))
    store.bind("default", "p", "node-a")
    store.patch(
        "pods", "default", "p", "application/merge-patch+json", {"metadata": {"labels": None}}
    )

    created, bound, relabelled = changes
    assert created.seen_through(on_node) is None
    added = bound.seen_through(on_node)
    assert added is not None and added[0] == "ADDED"
    modified = relabelled.seen_through(on_node)
    assert modified is not None and modified[0] == "MODIFIED"
    seen = relabelled.seen_through(by_label)
    assert seen is not None
    gone_type, gone = seen
    assert gone_type == "DELETED" and gone["metadata"]["labels"] == {"app": "demo"}
    assert gone["metadata"]["resourceVersion"] == str(relabelled.rv)


# Graceful deletion ---------------------------------------------------------------------------


def test_bound_pod_terminates_then_goes_on_grace_zero(store: Store, clock: Clock) -> None:
    changes = recorded(store)
    store.create("pods", "default", pod_manifest("a"))
    terminating = store.delete("pods", "default", "a", {})
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    assert terminating["metadata"]["deletionTimestamp"] == "2024-05-01T12:00:30Z"
    assert store.get("pods", "default", "a") == terminating

    clock.now += timedelta(seconds=5)
    final = store.delete("pods", "default", "a", {"gracePeriodSeconds": 0})
    with pytest.raises(NotFound):
        store.get("pods", "default", "a")
    assert [c.type for c in changes] == ["ADDED", "MODIFIED", "DELETED"]
    assert changes[-1].obj == final
    assert final["metadata"]["deletionGracePeriodSeconds"] == 0
    assert final["metadata"]["uid"] == terminating["metadata"]["uid"]
    assert int(final["metadata"]["resourceVersion"]) == store.resource_version


@pytest.mark.parametrize(
    ("pod", "options"),
    [
        (pod_manifest("a", node=None), {}),
        (pod_manifest("a"), {"gracePeriodSeconds": 0}),
        ({**pod_manifest("a"), "status": {"phase": "Succeeded"}}, {}),
        ({**pod_manifest("a"), "status": {"phase": "Failed"}}, {"gracePeriodSeconds": 60}),
    ],
    ids=["unbound", "grace-0", "succeeded", "failed"],
)
def test_pods_deleted_at_once(store: Store, pod: dict[str, Any], options: dict[str, Any]) -> None:
    changes = recorded(store)
    store.create("pods", "default", pod)
    store.delete("pods", "default", "a", options)
    assert [c.type for c in changes] == ["ADDED", "DELETED"]
    assert store.list("pods", None, EVERYTHING)[0] == []


def test_grace_comes_from_the_pod_spec_and_negative_means_one(store: Store) -> None:
    store.create("pods", "default", pod_manifest("a", terminationGracePeriodSeconds=5))
    store.create("pods", "default", pod_manifest("b"))
    assert store.delete("pods", "default", "a")["metadata"]["deletionGracePeriodSeconds"] == 5
    deleted = store.delete("pods", "default", "b", {"gracePeriodSeconds": -3})
    assert deleted["metadata"]["deletionGracePeriodSeconds"] == 1


def test_second_delete_only_shortens(store: Store, clock: Clock) -> None:
    changes = recorded(store)
    store.create("pods", "default", pod_manifest("a"))
    store.delete("pods", "default", "a", {"gracePeriodSeconds": 30})
    clock.now += timedelta(seconds=10)
    unchanged = store.delete("pods", "default", "a", {"gracePeriodSeconds": 60})
    assert unchanged["metadata"]["deletionGracePeriodSeconds"] == 30
    assert len(changes) == 2
    shortened = store.delete("pods", "default", "a", {"gracePeriodSeconds": 10})
    assert shortened["metadata"]["deletionGracePeriodSeconds"] == 10
    # The countdown started at the first delete: 12:00:00 + 10 s.
    assert shortened["metadata"]["deletionTimestamp"] == "2024-05-01T12:00:10Z"
    assert [c.type for c in changes] == ["ADDED", "MODIFIED", "MODIFIED"]


def test_uid_precondition(store: Store) -> None:
    uid = store.create("pods", "default", pod_manifest("a"))["metadata"]["uid"]
    with pytest.raises(Conflict) as raised:
        store.delete("pods", "default", "a", {"preconditions": {"uid": "someone-else"}})
    assert "Precondition failed" in raised.value.message
    store.get("pods", "default", "a")
    store.delete("pods", "default", "a", {"preconditions": {"uid": uid}, "gracePeriodSeconds": 0})
    with pytest.raises(NotFound):
        store.delete("pods", "default", "a", {})


# Updates ------------------------------------------------------------------------------------


def test_status_patch_changes_only_status(store: Store) -> None:
    created = store.create("pods", "default", pod_manifest("a"))
    patched = store.patch(
        "pods",
        "default",
        "a",
        "application/strategic-merge-patch+json",
        {"status": {"phase": "Running"}, "spec": {"nodeName": "elsewhere"}},
        "status",
    )
    assert patched["status"]["phase"] == "Running"
    assert patched["spec"] == created["spec"]
    assert int(patched["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])


def test_main_resource_patch_ignores_status_and_refuses_spec_changes(store: Store) -> None:
    store.create("pods", "default", pod_manifest("a"))
    patched = store.patch(
        "pods",
        "default",
        "a",
        "application/merge-patch+json",
        {"metadata": {"annotations": {"k": "v"}}, "status": {"phase": "Running"}},
    )
    assert patched["metadata"]["annotations"] == {"k": "v"}
    assert patched["status"]["phase"] == "Pending"
    with pytest.raises(Invalid):
        store.patch(
            "pods", "default", "a", "application/merge-patch+json", {"spec": {"nodeName": "b"}}
        )


def test_noop_update_writes_nothing(store: Store) -> None:
    changes = recorded(store)
    created = store.create("pods", "default", pod_manifest("a"))
    same = store.patch(
        "pods",
        "default",
        "a",
        "application/merge-patch+json",
        {"metadata": {"labels": {"app": "demo"}}},
    )
    assert same == created and len(changes) == 1


def test_replace_with_stale_version_conflicts(store: Store) -> None:
    created = store.create("pods", "default", pod_manifest("a"))
    running = {**created, "status": {"phase": "Running"}}
    store.replace("pods", "default", "a", running, "status")
    with pytest.raises(Conflict):
        store.replace("pods", "default", "a", {**created, "status": {"phase": "Failed"}}, "status")
    assert store.get("pods", "default", "a")["status"]["phase"] == "Running"


def test_bind_sets_the_node_once(store: Store) -> None:
    store.create("pods", "default", pod_manifest("a", node=None))
    assert store.bind("default", "a", "node-a")["spec"]["nodeName"] == "node-a"
    with pytest.raises(Conflict):
        store.bind("default", "a", "node-b")


# Injected objects ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "Pod", "metadata": {"name": "no-uid", "namespace": "default"}},
        {"kind": "Pod", "metadata": {"name": "odd", "namespace": "default", "uid": "../../etc"}},
        {"kind": "Pod", "metadata": "not-a-dict"},
        {"kind": "Pod"},
    ],
    ids=["no-uid", "path-uid", "bad-metadata", "no-metadata"],
)
def test_inject_stores_malformed_objects_as_given(store: Store, obj: dict[str, Any]) -> None:
    changes = recorded(store)
    key = ("default", "raw")
    stored = store.inject("pods", obj, key=key)
    assert changes[0].type == "ADDED" and changes[0].obj == stored
    assert {k: v for k, v in stored.items() if k != "metadata"} == {"kind": "Pod"}
    assert len(store.list("pods", None, EVERYTHING)[0]) == 1
    assert store.list("pods", None, selectors.parse("pods", "spec.nodeName=n", None))[0] == []
    store.inject("pods", obj, "DELETED", key=key)
    assert store.list("pods", None, EVERYTHING)[0] == []


def test_injected_pod_can_be_deleted_but_not_patched(store: Store) -> None:
    store.inject("pods", {"metadata": {"name": "odd", "namespace": "default"}})
    with pytest.raises(Invalid):
        store.patch("pods", "default", "odd", "application/merge-patch+json", {"metadata": {}})
    store.delete("pods", "default", "odd", {})
    assert store.list("pods", None, EVERYTHING)[0] == []
