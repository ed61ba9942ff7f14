"""Watches through the real kubernetes client: order, resume, 410, bookmarks, faults."""

from __future__ import annotations

import json
from collections.abc import Callable

import pydantic
import pytest
import urllib3
from kubernetes import client, watch

from partkeeper_sim.apiserver import ApiServerThread
from tests_support import until
from tests_support.kubeclient import WatchRecorder, of_type, pod_manifest

Record = Callable[..., WatchRecorder]


def versions(events: list) -> list[int]:
    return [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in events]


def names(events: list) -> list[str]:
    return [e["raw_object"]["metadata"]["name"] for e in events]


def test_lifecycle_in_order_with_increasing_versions(
    core: client.CoreV1Api, record_watch: Record
) -> None:
    start = core.list_pod_for_all_namespaces().metadata.resource_version
    recorder = record_watch(
        core.list_pod_for_all_namespaces,
        resource_version=start,
        field_selector="spec.nodeName=node-a",
    )
    created = core.create_namespaced_pod("default", pod_manifest("a"))
    core.create_namespaced_pod("default", pod_manifest("elsewhere", node="node-b"))
    core.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"}})
    core.delete_namespaced_pod("a", "default")
    core.delete_namespaced_pod("a", "default", grace_period_seconds=0)

    events = of_type(
        recorder.wait_for(lambda evs: bool(of_type(evs, "DELETED")), what="DELETED"), None)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]
    assert set(names(events)) == {"a"}
    assert versions(events) == sorted(set(versions(events)))
    running, terminating, deleted = (e["object"] for e in events[1:])
    assert running.status.phase == "Running" and running.metadata.deletion_timestamp is None
    assert terminating.metadata.deletion_timestamp is not None
    assert deleted.metadata.uid == created.metadata.uid
    assert deleted.metadata.deletion_timestamp is not None
    assert deleted.status.phase == "Running"


def test_watch_without_version_starts_with_the_current_objects(
    core: client.CoreV1Api, record_watch: Record
) -> None:
    core.create_namespaced_pod("default", pod_manifest("a"))
    core.create_namespaced_pod("default", pod_manifest("b"))
    recorder = record_watch(core.list_namespaced_pod, "default")
    assert names(recorder.wait_count(2, "ADDED")) == ["a", "b"]
    core.create_namespaced_pod("default", pod_manifest("c"))
    assert names(recorder.wait_count(3, "ADDED")) == ["a", "b", "c"]


def test_resume_replays_what_came_after(core: client.CoreV1Api, record_watch: Record) -> None:
    first = core.create_namespaced_pod("default", pod_manifest("a"))
    core.create_namespaced_pod("default", pod_manifest("b"))
    core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "1"}}})

    recorder = record_watch(
        core.list_namespaced_pod, "default", resource_version=first.metadata.resource_version
    )
    events = recorder.wait_count(2)
    assert [(e["type"], e["raw_object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
    ]
    assert versions(events)[0] > int(first.metadata.resource_version)


@pytest.mark.parametrize("timeout_seconds", [None, 30], ids=["retrying", "with-timeout"])
def test_compacted_history_raises_410(
    core: client.CoreV1Api, apiserver: ApiServerThread, timeout_seconds: int | None
) -> None:
    """The server answers 200 with an ERROR event holding a 410 Status; the client turns it into
    ApiException(410), after one retry from the same version when no timeout is given."""
    old = core.create_namespaced_pod("default", pod_manifest("a")).metadata.resource_version
    core.create_namespaced_pod("default", pod_manifest("b"))
    apiserver.compact()
    kwargs = {"timeout_seconds": timeout_seconds} if timeout_seconds else {}
    with pytest.raises(client.ApiException) as raised:
        for _ in watch.Watch().stream(
            core.list_namespaced_pod, "default", resource_version=old, **kwargs
        ):
            pytest.fail("no event may precede the 410")
    assert raised.value.status == 410
    assert "Expired" in raised.value.reason


def test_410_on_the_wire_is_an_error_event(
    core: client.CoreV1Api, apiserver: ApiServerThread
) -> None:
    old = core.create_namespaced_pod("default", pod_manifest("a")).metadata.resource_version
    core.create_namespaced_pod("default", pod_manifest("b"))
    apiserver.compact()
    query = f"watch=1&resourceVersion={old}&timeoutSeconds=30"
    response = urllib3.PoolManager().request(
        "GET", f"{apiserver.url}/api/v1/namespaces/default/pods?{query}", timeout=30
    )
    assert response.status == 200
    lines = response.data.decode().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["type"] == "ERROR"
    assert (event["object"]["kind"], event["object"]["code"], event["object"]["reason"]) == (
        "Status",
        410,
        "Expired",
    )


def test_bookmarks_only_when_requested(core: client.CoreV1Api, record_watch: Record) -> None:
    start = core.list_namespaced_pod("default").metadata.resource_version
    with_bookmarks = record_watch(
        core.list_namespaced_pod, "default", resource_version=start, allow_watch_bookmarks=True
    )
    without = record_watch(core.list_namespaced_pod, "default", resource_version=start)
    bookmarks = with_bookmarks.wait_count(3, "BOOKMARK")
    created = core.create_namespaced_pod("default", pod_manifest("a"))
    with_bookmarks.wait_for(lambda evs: bool(of_type(evs, "ADDED")), what="ADDED")
    without.wait_count(1, "ADDED")

    for bookmark in bookmarks:
        assert set(bookmark["raw_object"]) == {"kind", "apiVersion", "metadata"}
        assert set(bookmark["raw_object"]["metadata"]) == {"resourceVersion"}
        assert bookmark["raw_object"]["kind"] == "Pod"
        assert int(bookmark["raw_object"]["metadata"]["resourceVersion"]) >= int(start)
    assert of_type(without.events, "BOOKMARK") == []
    later = with_bookmarks.wait_for(
        lambda evs: any(
            int(e["raw_object"]["metadata"]["resourceVersion"])
            >= int(created.metadata.resource_version)
            for e in of_type(evs, "BOOKMARK")
        ),
        what="a bookmark at or after the create",
    )
    marks = [
        int(e["raw_object"]["metadata"]["resourceVersion"]) for e in of_type(later, "BOOKMARK")
    ]
    assert marks == sorted(marks)


def test_timeout_seconds_ends_the_stream(core: client.CoreV1Api, record_watch: Record) -> None:
    recorder = record_watch(core.list_namespaced_pod, "default", timeout_seconds=1)
    recorder.wait_finished(timeout=30)
    assert recorder.error is None and recorder.events == []


def test_binding_enters_a_node_selected_watch_as_added(
    core: client.CoreV1Api, apiserver: ApiServerThread, record_watch: Record
) -> None:
    recorder = record_watch(
        core.list_pod_for_all_namespaces,
        field_selector="spec.nodeName=node-a",
        allow_watch_bookmarks=True,
    )
    recorder.wait_count(1, "BOOKMARK")
    core.create_namespaced_pod("default", pod_manifest("a", node=None))
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name="a"),
        target=client.V1ObjectReference(kind="Node", name="node-a"),
    )
    # The server answers a binding with a Status, as the real one does, which the client cannot
    # read as the V1Binding it expects; so the response is taken raw.
    response = core.create_namespaced_pod_binding("a", "default", binding, _preload_content=False)
    assert response.status == 201
    added = recorder.wait_count(1, "ADDED")
    assert added[0]["object"].spec.node_name == "node-a"
    assert of_type(recorder.events, "MODIFIED") == []


async def test_raw_garbage_line_yields_none(
    core: client.CoreV1Api, apiserver: ApiServerThread, record_watch: Record
) -> None:
    recorder = record_watch(core.list_namespaced_pod, "default", resource_version="1")
    await until(lambda: apiserver.open_watches() == 1, "the watch to open")
    assert apiserver.send_raw_watch_line("pods", "this is not json") == 1
    core.create_namespaced_pod("default", pod_manifest("a"))
    events = recorder.wait_for(lambda evs: len(evs) >= 2, what="2 events")
    assert events[0] is None
    assert events[1] is not None and events[1]["type"] == "ADDED"


async def test_malformed_pods_reach_the_client_as_stored(
    core: client.CoreV1Api, apiserver: ApiServerThread, record_watch: Record
) -> None:
    raw = record_watch(core.list_namespaced_pod, "default", deserialize=False)
    typed = record_watch(core.list_namespaced_pod, "default")
    await until(lambda: apiserver.open_watches() == 2, "both watches to open")
    apiserver.inject(
        "pods", {"metadata": {"name": "odd", "namespace": "default", "uid": "../../etc"}}
    )
    apiserver.inject("pods", {"metadata": {"name": "no-uid", "namespace": "default"}, "spec": {}})

    raw_events = raw.wait_count(2, "ADDED")
    assert raw_events[0]["object"]["metadata"]["uid"] == "../../etc"
    assert "uid" not in raw_events[1]["object"]["metadata"]
    # The typed stream deserialises into the client's models, which require
    # spec.containers: the second object ends the stream with a validation error.
    typed.wait_finished()
    assert of_type(typed.events, None)[0]["object"].metadata.uid == "../../etc"
    assert isinstance(typed.error, pydantic.ValidationError)


async def test_unavailable_ends_watches_and_the_client_sees_503(
    core: client.CoreV1Api, apiserver: ApiServerThread, record_watch: Record
) -> None:
    start = core.create_namespaced_pod("default", pod_manifest("a")).metadata.resource_version
    recorder = record_watch(core.list_namespaced_pod, "default", resource_version=start)
    await until(lambda: apiserver.open_watches() == 1, "the watch to open")
    apiserver.set_unavailable(True)
    recorder.wait_finished()
    assert isinstance(recorder.error, client.ApiException) and recorder.error.status == 503
    assert apiserver.open_watches() == 0


async def test_stalled_watch_holds_events_until_released(
    core: client.CoreV1Api, apiserver: ApiServerThread, record_watch: Record
) -> None:
    start = core.list_namespaced_pod("default").metadata.resource_version
    recorder = record_watch(core.list_namespaced_pod, "default", resource_version=start)
    await until(lambda: apiserver.open_watches() == 1, "the watch to open")
    apiserver.stall_watches(True)
    core.create_namespaced_pod("default", pod_manifest("a"))
    core.create_namespaced_pod("default", pod_manifest("b"))
    await until(lambda: apiserver.undelivered_watch_events() == 2, "two held events")
    assert recorder.events == []
    apiserver.stall_watches(False)
    assert names(recorder.wait_count(2, "ADDED")) == ["a", "b"]
