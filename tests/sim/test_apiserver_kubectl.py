"""What kubectl reads from the simulated API server, as pure functions: the OpenAPI v3 index and
documents (client-go's QueryParamVerifierV3 rules), the strict field check, the Table printers
(kubernetes/pkg/printers/internalversion) and the simulated kubelet's Node resources.
The same paths through the real kubectl: tests/stack/test_kubectl.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from partkeeper_sim.apiserver import openapi, table
from partkeeper_sim.kubelet.node import resources
from partkeeper_sim.kubelet.pods import ContainerView, PodView
from partkeeper_sim.kubelet.podstatus import status_fields

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _stamp(ago: float) -> str:
    return (NOW - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(("kind", "api_version"), [
    (k.kind, k.api_version) for k in openapi.KINDS])
def test_every_kind_has_a_patch_operation_taking_field_validation(kind, api_version) -> None:
    """QueryParamVerifierV3: a PATCH whose GVK extension names the kind and which takes the
    `fieldValidation` query parameter means the server validates, so kubectl does not need
    /openapi/v2."""
    gv = f"apis/{api_version}" if "/" in api_version else f"api/{api_version}"
    url = openapi.index()["paths"][gv]["serverRelativeURL"]
    assert url.startswith(f"/openapi/v3/{gv}?hash=")
    doc = openapi.document(gv)
    assert doc is not None and doc["openapi"].startswith("3.")
    patches = [p["patch"] for p in doc["paths"].values() if "patch" in p
               and p["patch"]["x-kubernetes-group-version-kind"]["kind"] == kind]
    assert patches
    for op in patches:
        assert {"name": "fieldValidation", "in": "query"}.items() <= op["parameters"][0].items()


def test_the_strict_check_names_unknown_fields_as_the_real_decoder() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "labelz": {}},
           "spec": {"containers": [{"name": "m", "image": "x", "imagee": "y"}], "nodeNam": "n"},
           "extra": 1}
    errors = openapi.strict_errors(pod)
    assert errors == ["extra", "metadata.labelz", "spec.nodeNam", "spec.containers[0].imagee"]
    assert openapi.strict_message(pod, errors[:1]) == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "extra"')
    assert openapi.strict_errors({**pod, "extra": None} | {"metadata": {}, "spec": {}}) == [
        "extra"]
    assert openapi.strict_errors({"apiVersion": "v9", "kind": "Thing", "x": 1}) == []


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (119, "119s"), (120, "2m"), (185, "3m5s"), (600, "10m"), (3 * 3600, "3h"),
    (3 * 3600 + 60, "3h1m"), (9 * 3600, "9h"), (49 * 3600, "2d1h"), (10 * 86400, "10d"),
    (800 * 86400, "2y70d"), (9 * 365 * 86400, "9y"), (-5, "<invalid>")])
def test_ages_read_as_human_duration(seconds: float, shown: str) -> None:
    assert table.human_duration(seconds) == shown


def _pod(**status: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "creationTimestamp": _stamp(30)},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "n"},
            "status": status}


def a_table(body: dict[str, Any], include: str = "PartialObjectMetadata",
            now: datetime | None = None) -> dict[str, Any]:
    """`table.to_table`, failing the test where it makes no Table of `body`."""
    found = table.to_table(body, include, now)
    if found is None:
        raise AssertionError(f"no Table of a {body.get('kind')}")
    return found


@pytest.mark.parametrize(("status", "ready", "reason"), [
    ({"phase": "Pending"}, "0/2", "Pending"),
    ({"phase": "Failed", "reason": "UnexpectedAdmissionError"}, "0/2",
     "UnexpectedAdmissionError"),
    ({"phase": "Running", "containerStatuses": [
        {"ready": True, "state": {"running": {}}},
        {"ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
         "restartCount": 3}]}, "1/2", "CrashLoopBackOff"),
    ({"phase": "Succeeded", "containerStatuses": [
        {"state": {"terminated": {"reason": "Completed", "exitCode": 0}}}] * 2}, "0/2",
     "Completed"),
])
def test_pod_rows_print_ready_and_status_as_print_pod(status, ready, reason) -> None:
    [row] = a_table(_pod(**status), now=NOW)["rows"]
    assert row["cells"][1:3] == [ready, reason]
    assert row["cells"][4] == "30s" and row["cells"][6] == "n"
    assert row["object"]["kind"] == "PartialObjectMetadata"


def test_a_deleted_running_pod_is_terminating_and_lists_keep_their_version() -> None:
    pod = _pod(phase="Running")
    pod["metadata"]["deletionTimestamp"] = _stamp(0)
    listed = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
              "items": [pod]}
    found = a_table(listed, "None", now=NOW)
    assert found["metadata"] == {"resourceVersion": "7"}
    assert [c["name"] for c in found["columnDefinitions"]] == [
        "Name", "Ready", "Status", "Restarts", "Age", "IP", "Node", "Nominated Node",
        "Readiness Gates"]
    assert found["rows"][0]["cells"][2] == "Terminating" and "object" not in found["rows"][0]
    assert table.to_table({"kind": "Status", "apiVersion": "v1"}) is None
    assert table.wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert not table.wants_table("application/json")


def test_the_sim_kubelets_statuses_read_as_kubelets() -> None:
    pod = PodView("u1", "default", "p", containers=(ContainerView("a"),))
    running = {**status_fields(pod, "Running", ""), "phase": "Running"}
    [row] = a_table(_pod(**running) | {"spec": {"containers": [{"name": "a"}]}},
                    now=NOW)["rows"]
    assert row["cells"][1:4] == ["1/1", "Running", "0"] and row["cells"][5].startswith("10.88.")
    rejected = status_fields(pod, "Failed", "UnexpectedAdmissionError")
    assert "containerStatuses" not in rejected and "podIP" not in rejected


class _Kubelet:
    def __init__(self, devices: dict[str, dict[str, str]]) -> None:
        self._devices = devices

    @property
    def registrations(self) -> list[object]:
        return [type("R", (), {"resource_name": r})() for r in self._devices]

    def devices(self, resource: str) -> dict[str, str]:
        return self._devices[resource]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        raise AssertionError("the node's resources are read, never waited for")


def test_node_capacity_counts_every_device_and_allocatable_the_healthy() -> None:
    kubelet = _Kubelet({"nvidia.com/mig-1g.10gb": {"a": "Healthy", "b": "Unhealthy"}})
    assert resources(kubelet, {}) == ({"nvidia.com/mig-1g.10gb": "2"},
                                      {"nvidia.com/mig-1g.10gb": "1"})
    gone = _Kubelet({})
    before = {"nvidia.com/mig-1g.10gb": "2", "cpu": "8"}
    assert resources(gone, before) == ({"nvidia.com/mig-1g.10gb": "0"},
                                       {"nvidia.com/mig-1g.10gb": "0"})


def test_a_watch_list_request_is_refused_as_a_1_30_server_refuses_it() -> None:
    """client-go 1.35+ asks for initial events; the refusal makes its reflector fall back to
    LIST then WATCH (a server that ignored the parameters would leave it waiting)."""
    from partkeeper_sim.apiserver import watchlist

    asked = {"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
             "allowWatchBookmarks": "true"}
    said = watchlist.refusal(asked)
    assert said is not None and said.startswith('ListOptions.meta.k8s.io "" is invalid: [')
    assert "sendInitialEvents is forbidden for watch unless the WatchList feature gate" in said
    assert watchlist.refusal({"watch": "true", "resourceVersion": "5"}) is None
    assert watchlist.refusal({"resourceVersionMatch": "NotOlderThan"}) is None  # a LIST
