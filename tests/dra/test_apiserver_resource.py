"""The simulated API server's resource.k8s.io/v1 kinds, driven by the real kubernetes client."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from partkeeper.dra import DRIVER, slices
from partkeeper.drivers import Card
from tests_support.kubeclient import pod_manifest

H100 = Card(0, "GPU-0", "H100-80GB", "partition", 81920)


def claim_body(name: str, profile: str = "1g.10gb") -> dict:
    selector = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    return {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": DRIVER, "selectors": [{"cel": {"expression": selector}}]}}]}},
    }


def test_published_slices_round_trip_through_the_client(
    resource_api: client.ResourceV1Api,
) -> None:
    for body in slices.slices(slices.pool("node-a", [H100], [], []), 1):
        resource_api.create_resource_slice(body)
    listed = resource_api.list_resource_slice(
        field_selector=f"spec.nodeName=node-a,spec.driver={DRIVER}"
    )
    kinds = sorted("counters" if s.spec.shared_counters else "devices" for s in listed.items)
    assert kinds == ["counters", "devices"]
    devices = next(s for s in listed.items if s.spec.devices).spec.devices
    assert devices[0].name == "gpu-0-mig-1g10gb-0"
    assert devices[0].consumes_counters[0].counters["memory-slice-0"].value == "1"
    assert devices[0].attributes[f"{DRIVER}/profile"].string == "1g.10gb"
    assert resource_api.list_resource_slice(field_selector="spec.nodeName=node-b").items == []


def test_slice_with_devices_and_counters_is_refused(resource_api: client.ResourceV1Api) -> None:
    counters, devices = slices.slices(slices.pool("node-a", [H100], [], []), 1)
    mixed = {**devices, "spec": {**devices["spec"],
                                 "sharedCounters": counters["spec"]["sharedCounters"]}}
    with pytest.raises(ApiException) as raised:
        resource_api.create_resource_slice(mixed)
    assert raised.value.status == 422
    assert resource_api.list_resource_slice().items == []


def test_slice_over_the_device_limit_is_refused(resource_api: client.ResourceV1Api) -> None:
    cards = [Card(i, f"GPU-{i}", "H100-80GB", "partition", 81920) for i in range(4)]
    pool = slices.pool("node-a", cards, [], [])
    body = slices.slices(pool, 1)[-1]
    body["spec"]["devices"] = list(pool.devices[:65])
    with pytest.raises(ApiException) as raised:
        resource_api.create_resource_slice(body)
    assert raised.value.status == 422


def test_claim_status_and_pod_claim_statuses(
    resource_api: client.ResourceV1Api, kubeconfig
) -> None:
    resource_api.create_device_class({"metadata": {"name": DRIVER}, "spec": {"selectors": [
        {"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
    made = resource_api.create_namespaced_resource_claim("default", claim_body("c1"))
    assert made.metadata.uid and made.spec.devices.requests[0].exactly.count == 1
    status = {"status": {
        "allocation": {"devices": {"results": [{"request": "mig", "driver": DRIVER,
                                                "pool": "node-a",
                                                "device": "gpu-0-mig-1g10gb-0"}]}},
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": "u-1"}],
    }}
    patched = resource_api.patch_namespaced_resource_claim_status("c1", "default", status)
    assert patched.status.allocation.devices.results[0].device == "gpu-0-mig-1g10gb-0"
    assert patched.status.reserved_for[0].uid == "u-1"
    read = resource_api.read_namespaced_resource_claim("c1", "default")
    assert read.status.reserved_for[0].name == "p1"
    resource_api.create_namespaced_resource_claim_template(
        "default", {"metadata": {"name": "t1"}, "spec": claim_body("ignored")})
    assert [t.metadata.name for t in
            resource_api.list_namespaced_resource_claim_template("default").items] == ["t1"]
    core = client.CoreV1Api(resource_api.api_client)
    pod = pod_manifest("p1", resourceClaims=[{"name": "mig", "resourceClaimTemplateName": "t1"}])
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "mig"}]}
    core.create_namespaced_pod("default", pod)
    core.patch_namespaced_pod_status("p1", "default", {"status": {"resourceClaimStatuses": [
        {"name": "mig", "resourceClaimName": "c1"}]}})
    got = core.read_namespaced_pod("p1", "default")
    assert got.spec.resource_claims[0].resource_claim_template_name == "t1"
    assert got.status.resource_claim_statuses[0].resource_claim_name == "c1"
    resource_api.delete_namespaced_resource_claim("c1", "default")
    assert resource_api.list_namespaced_resource_claim("default").items == []


def test_claim_without_a_class_is_refused(resource_api: client.ResourceV1Api) -> None:
    body = {"metadata": {"name": "bad"}, "spec": {"devices": {"requests": [{"name": "x"}]}}}
    with pytest.raises(ApiException) as raised:
        resource_api.create_namespaced_resource_claim("default", body)
    assert raised.value.status == 422
    assert "exactly one of `exactly` or `firstAvailable`" in raised.value.body
