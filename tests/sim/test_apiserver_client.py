"""The real kubernetes client against the simulated API server: requests that are not watches."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, config

from partkeeper_sim.apiserver import ApiServerThread
from tests_support.kubeclient import pod_manifest


def test_kubeconfig_loads_with_the_standard_loader(kubeconfig: Path) -> None:
    configuration = client.Configuration()
    config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration
    )
    with client.ApiClient(configuration) as api_client:
        version = client.VersionApi(api_client).get_code()
        assert version.major == "1"
        assert "v1" in client.CoreApi(api_client).get_api_versions().versions


def test_create_get_and_list_with_field_selector(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod_manifest("on-a"))
    core.create_namespaced_pod("default", pod_manifest("on-b", node="node-b"))
    core.create_namespaced_pod("other", pod_manifest("elsewhere"))

    assert created.metadata.uid and created.metadata.namespace == "default"
    assert created.metadata.creation_timestamp is not None
    assert created.status.phase == "Pending"
    fetched = core.read_namespaced_pod("on-a", "default")
    assert fetched.metadata.uid == created.metadata.uid

    on_a = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-a")
    assert sorted(p.metadata.name for p in on_a.items) == ["elsewhere", "on-a"]
    assert int(on_a.metadata.resource_version) >= int(fetched.metadata.resource_version)
    by_name = core.list_namespaced_pod("default", field_selector="metadata.name=on-b")
    assert [p.metadata.name for p in by_name.items] == ["on-b"]
    labelled = core.list_namespaced_pod("default", label_selector="app=demo")
    assert len(labelled.items) == 2


@pytest.mark.parametrize(
    ("call", "status", "reason"),
    [
        (lambda core: core.read_namespaced_pod("missing", "default"), 404, "NotFound"),
        (lambda core: core.delete_namespaced_pod("missing", "default"), 404, "NotFound"),
        (
            lambda core: core.create_namespaced_pod("default", pod_manifest("dup")),
            409,
            "AlreadyExists",
        ),
        (
            lambda core: core.list_namespaced_pod("default", field_selector="spec.bogus=1"),
            400,
            "BadRequest",
        ),
        (
            lambda core: core.create_namespaced_pod(
                "default", {"metadata": {"name": "x"}, "spec": {"containers": [{"name": ""}]}}
            ),
            422,
            "Invalid",
        ),
    ],
    ids=["get-404", "delete-404", "create-409", "selector-400", "invalid-422"],
)
def test_errors_reach_the_client_as_status(
    core: client.CoreV1Api, call: Callable[[client.CoreV1Api], Any], status: int, reason: str
) -> None:
    core.create_namespaced_pod("default", pod_manifest("dup"))
    with pytest.raises(client.ApiException) as raised:
        call(core)
    assert raised.value.status == status
    body = json.loads(raised.value.body)
    assert (body["kind"], body["code"], body["reason"]) == ("Status", status, reason)


def test_malformed_json_is_bad_request(apiserver: ApiServerThread) -> None:
    http = urllib3.PoolManager()
    response = http.request(
        "POST",
        f"{apiserver.url}/api/v1/namespaces/default/pods",
        body=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 400
    assert json.loads(response.data)["reason"] == "BadRequest"
    unknown = http.request("GET", f"{apiserver.url}/api/v1/widgets")
    assert unknown.status == 404 and json.loads(unknown.data)["kind"] == "Status"


def test_graceful_delete_then_final_delete(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod_manifest("a"))
    terminating = core.delete_namespaced_pod("a", "default")
    assert isinstance(terminating, client.V1Pod)
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 30
    assert core.read_namespaced_pod("a", "default").metadata.deletion_timestamp is not None

    final = core.delete_namespaced_pod(
        "a", "default", body=client.V1DeleteOptions(grace_period_seconds=0)
    )
    assert final.metadata.uid == created.metadata.uid
    with pytest.raises(client.ApiException) as raised:
        core.read_namespaced_pod("a", "default")
    assert raised.value.status == 404


def test_unbound_pod_is_deleted_at_once(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("a", node=None))
    core.delete_namespaced_pod("a", "default", grace_period_seconds=30)
    assert core.list_namespaced_pod("default").items == []


def test_uid_precondition_conflict(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("a"))
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-this-one"))
    with pytest.raises(client.ApiException) as raised:
        core.delete_namespaced_pod("a", "default", body=options)
    assert raised.value.status == 409
    assert core.read_namespaced_pod("a", "default").metadata.deletion_timestamp is None


def test_status_patch_and_put(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod_manifest("a"))
    running = core.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"}})
    assert running.status.phase == "Running"
    assert int(running.metadata.resource_version) > int(created.metadata.resource_version)

    running.status.phase = "Succeeded"
    done = core.replace_namespaced_pod_status("a", "default", running)
    assert done.status.phase == "Succeeded"
    running.status.phase = "Failed"
    with pytest.raises(client.ApiException) as raised:
        core.replace_namespaced_pod_status("a", "default", running)
    assert raised.value.status == 409


def test_json_patch_and_label_patch(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("a"))
    labelled = core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"tier": "web"}}})
    assert labelled.metadata.labels == {"app": "demo", "tier": "web"}
    annotated = core.patch_namespaced_pod(
        "a", "default", [{"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}]
    )
    assert annotated.metadata.annotations == {"k": "v"}


def test_events_through_both_apis(core: client.CoreV1Api, apiserver: ApiServerThread) -> None:
    core.create_namespaced_event(
        "default",
        {
            "metadata": {"generateName": "a."},
            "involvedObject": {"kind": "Pod", "name": "a", "namespace": "default"},
            "reason": "Allocated",
            "message": "partition granted",
            "type": "Normal",
        },
    )
    events_v1 = client.EventsV1Api(core.api_client)
    events_v1.create_namespaced_event(
        "default",
        client.EventsV1Event(
            metadata=client.V1ObjectMeta(name="b.1"),
            event_time=datetime.now(UTC),
            regarding=client.V1ObjectReference(kind="Pod", name="b", namespace="default"),
            reason="Reclaimed",
            note="partition destroyed",
            type="Normal",
            action="Reclaim",
            reporting_controller="partkeeper.io/reclaimer",
            reporting_instance="node-a",
        ),
    )

    core_view = core.list_namespaced_event("default")
    assert sorted(e.reason for e in core_view.items) == ["Allocated", "Reclaimed"]
    group_view = events_v1.list_namespaced_event("default")
    assert sorted(e.note for e in group_view.items) == ["partition destroyed", "partition granted"]
    selected = core.list_event_for_all_namespaces(field_selector="involvedObject.name=b")
    assert [e.message for e in selected.items] == ["partition destroyed"]
    assert sorted(e["reason"] for e in apiserver.events("default")) == ["Allocated", "Reclaimed"]


def test_nodes_get_and_status_patch(core: client.CoreV1Api, apiserver: ApiServerThread) -> None:
    node = core.read_node("node-a")
    assert node.metadata.labels["kubernetes.io/hostname"] == "node-a"
    patched = core.patch_node_status(
        "node-a",
        {
            "status": {
                "capacity": {"nvidia.com/mig-1g.10gb": "7"},
                "allocatable": {"nvidia.com/mig-1g.10gb": "7"},
            }
        },
    )
    assert patched.status.allocatable["nvidia.com/mig-1g.10gb"] == "7"
    assert patched.status.capacity["cpu"] == "8"
    labelled = core.patch_node("node-a", {"metadata": {"labels": {"gpu": "yes"}}})
    assert labelled.metadata.labels["gpu"] == "yes"
    assert apiserver.get_node("node-a")["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "7"


def test_nodes_are_not_invented_when_auto_create_is_off(tmp_path: Path) -> None:
    with ApiServerThread(auto_create_nodes=False) as server:
        http = urllib3.PoolManager()
        assert http.request("GET", f"{server.url}/api/v1/nodes/node-a").status == 404
        server.add_node("node-a")
        assert http.request("GET", f"{server.url}/api/v1/nodes/node-a").status == 200


def test_unavailable_server_fails_requests(
    core: client.CoreV1Api, apiserver: ApiServerThread
) -> None:
    apiserver.set_unavailable(True)
    with pytest.raises(client.ApiException) as raised:
        core.list_pod_for_all_namespaces()
    assert raised.value.status == 503
    apiserver.set_unavailable(False)
    assert core.list_pod_for_all_namespaces().items == []


def test_admin_changes_are_visible_over_http(
    core: client.CoreV1Api, apiserver: ApiServerThread
) -> None:
    apiserver.create_pod(pod_manifest("a", node=None))
    apiserver.bind_pod("default", "a", "node-a")
    apiserver.patch_pod("default", "a", {"status": {"phase": "Running"}}, status=True)
    pod = core.read_namespaced_pod("a", "default")
    assert (pod.spec.node_name, pod.status.phase) == ("node-a", "Running")
    assert [
        p["metadata"]["name"] for p in apiserver.list_pods(field_selector="spec.nodeName=node-a")
    ] == ["a"]
    apiserver.delete_pod("default", "a", grace_period_seconds=0)
    assert core.list_namespaced_pod("default").items == []


def test_events_group_patch_uses_its_own_field_names(core: client.CoreV1Api) -> None:
    core.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "e"},
            "involvedObject": {"kind": "Pod", "name": "a", "namespace": "default"},
            "reason": "Blocked",
            "message": "no room",
        },
    )
    events_v1 = client.EventsV1Api(core.api_client)
    patched = events_v1.patch_namespaced_event("e", "default", {"note": "room found"})
    assert patched.note == "room found"
    assert core.read_namespaced_event("e", "default").message == "room found"
