"""DRA extended resources (KEP-5004, GA in 1.37): a Pod whose spec asks for the device-plugin
resource `nvidia.com/mig-<profile>` runs on a DRA node unchanged, through the DeviceClasses
deploy/ ships, the simulated scheduler's special ResourceClaim and the simulated kubelet's
routing by `status.extendedResourceClaimStatus.requestMappings`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from partkeeper.dra import DRIVER
from partkeeper.dra.classes import extended_classes, render
from partkeeper.kubelet import dra_pb2
from partkeeper_sim.kubelet.admission import device_requests
from partkeeper_sim.kubelet.draclaims import EXTENDED, ClaimInfo, container_devices
from partkeeper_sim.kubelet.pods import pod_from_manifest
from partkeeper_sim.scheduler import extended
from tests_support import until
from tests_support.dra import NAMESPACE, control_plane, dra_node, phase

MANIFEST = (Path(__file__).resolve().parents[2] / "deploy" / "components" / "dra"
            / "extended-resources.yaml")


def shipped() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def install(resource: client.ResourceV1Api) -> None:
    """As an administrator applying deploy/components/dra/extended-resources.yaml."""
    for body in shipped():
        resource.create_device_class(body)


def unchanged_pod(name: str) -> dict[str, Any]:
    """A device-plugin Pod spec as written for nvidia.com/mig-*: limits only, an init container
    without devices, a cpu request beside the partition (it shifts the request index)."""
    return {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {
        "initContainers": [{"name": "setup", "image": "busybox"}],
        "containers": [
            {"name": "a", "image": "busybox", "resources": {
                "requests": {"cpu": "100m"}, "limits": {"nvidia.com/mig-1g.10gb": "1"}}},
            {"name": "b", "image": "busybox", "resources": {
                "limits": {"nvidia.com/mig-2g.20gb": "1"}}},
        ]}}


def raw(call: Any, *args: Any) -> dict[str, Any]:
    return json.loads(call(*args, _preload_content=False).data)


# -- the shipped DeviceClasses -----------------------------------------------------------------

def test_deploy_ships_one_class_per_profile_with_the_device_plugin_resource_name() -> None:
    docs = shipped()
    assert docs == extended_classes(), "regenerate: python -m partkeeper.dra.classes"
    assert MANIFEST.read_text() == render()
    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    names = {d["spec"]["extendedResourceName"]: d["metadata"]["name"] for d in docs}
    assert names["nvidia.com/mig-1g.10gb"] == "mig-1g10gb.partitions.partkeeper.io"
    assert names["nvidia.com/mig-7g.141gb"] == "mig-7g141gb.partitions.partkeeper.io"
    assert names["alibabacloud.com/ppu.partitioned.mig-4g.48gb"] == \
        "mig-4g48gb.partitions.partkeeper.io"
    assert names["hygon.com/dcu.partitioned.mig-2g.15gb"] == "mig-2g15gb.partitions.partkeeper.io"
    assert len(names) == len(docs), "one extended resource name per class"
    kustomization = yaml.safe_load((MANIFEST.parent / "kustomization.yaml").read_text())
    assert "extended-resources.yaml" in kustomization["resources"]


def test_each_class_selects_exactly_our_devices_of_its_profile() -> None:
    from partkeeper_sim.scheduler import cel

    for doc in shipped():
        (selector,) = doc["spec"]["selectors"]
        profile = doc["spec"]["extendedResourceName"].rsplit("mig-", 1)[1]
        for candidate in (profile, "1g.10gb", "7g.80gb"):
            device = {"attributes": {"profile": {"string": candidate}}}
            assert cel.matches(selector["cel"]["expression"], device, DRIVER) == \
                (candidate == profile)
            assert not cel.matches(selector["cel"]["expression"], device, "other.example.com")


# -- the scheduler's decisions (pure) ------------------------------------------------------------

def pod_with_uid(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "uid": "u-1"}}


def test_the_special_claim_has_one_request_per_container_and_resource_named_as_upstream() -> None:
    pod = pod_with_uid(unchanged_pod("p"))
    mapping = extended.class_mapping({d["metadata"]["name"]: d for d in shipped()})
    served = extended.through_dra(pod, mapping, {})
    assert served == {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}
    claim = extended.special_claim(pod, served, mapping)
    assert claim["metadata"]["generateName"] == "p-extended-resources-"
    assert claim["metadata"]["annotations"] == {extended.ANNOTATION: "true"}
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Pod", "u-1", True)
    requests = {r["name"]: r["exactly"] for r in claim["spec"]["devices"]["requests"]}
    # container index over initContainers + containers; request index over the sorted names
    # of all the container's requests (cpu first).
    assert requests == {
        "container-1-request-1": {"deviceClassName": "mig-1g10gb.partitions.partkeeper.io",
                                  "allocationMode": "ExactCount", "count": 1},
        "container-2-request-0": {"deviceClassName": "mig-2g20gb.partitions.partkeeper.io",
                                  "allocationMode": "ExactCount", "count": 1},
    }
    assert extended.request_mappings(claim, pod) == [
        {"containerName": "a", "resourceName": "nvidia.com/mig-1g.10gb",
         "requestName": "container-1-request-1"},
        {"containerName": "b", "resourceName": "nvidia.com/mig-2g.20gb",
         "requestName": "container-2-request-0"},
    ]


@pytest.mark.parametrize(("allocatable", "through"), [
    ({}, True),                                  # no device plugin ever advertised it
    ({"nvidia.com/mig-1g.10gb": "0"}, True),     # its plugin went away: kubelet reports 0
    ({"nvidia.com/mig-1g.10gb": "3"}, False),    # the device plugin serves it on this node
])
def test_a_name_is_served_by_the_device_plugin_while_the_node_advertises_it(
    allocatable: dict[str, str], through: bool
) -> None:
    pod = pod_with_uid({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}})
    mapping = extended.class_mapping({d["metadata"]["name"]: d for d in shipped()})
    assert bool(extended.through_dra(pod, mapping, allocatable)) is through


def test_without_a_class_or_a_plugin_the_pod_does_not_fit() -> None:
    pod = pod_with_uid({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}})
    with pytest.raises(extended.DoesNotFit, match=re.escape("nvidia.com/mig-1g.10gb")):
        extended.through_dra(pod, {}, {})


def test_an_extended_resource_name_two_classes_claim_maps_neither() -> None:
    a = {"spec": {"extendedResourceName": "example.com/x"}}
    mapping = extended.class_mapping({"one": a, "two": a})
    assert "example.com/x" not in mapping
    assert mapping["deviceclass.resource.kubernetes.io/one"] == "one"


def test_a_pod_s_special_claim_is_found_again_by_its_annotation_and_owner() -> None:
    # A pass that made the claim and failed before the binding: the next one reuses it.
    pod = pod_with_uid(unchanged_pod("p"))
    mapping = extended.class_mapping({d["metadata"]["name"]: d for d in shipped()})
    claim = extended.special_claim(pod, extended.through_dra(pod, mapping, {}), mapping)
    other = pod_with_uid(unchanged_pod("q"))
    other["metadata"]["uid"] = "u-2"
    assert extended.made_for(pod, [claim]) is claim
    assert extended.made_for(other, [claim]) is None
    plain = {**claim, "metadata": {**claim["metadata"], "annotations": {}}}
    assert extended.made_for(pod, [plain]) is None, "a claim of the Pod's own is not special"


# -- the kubelet's side (pure) ---------------------------------------------------------------

def test_kubelet_routes_devices_by_the_request_mappings_not_by_request_names() -> None:
    # A mapping that the request names alone would route elsewhere: container-0-... is given
    # to the second container. Kubelet must follow the mapping (KEP-5004: the naming is
    # informational only).
    asks = {"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}
    containers = [{"name": "first", **asks}, {"name": "second", **asks}]
    pod: dict[str, Any] = {"spec": {"containers": containers},
           "status": {"extendedResourceClaimStatus": {
               "resourceClaimName": "p-extended-resources-x",
               "requestMappings": [{"containerName": "second",
                                    "resourceName": "nvidia.com/mig-1g.10gb",
                                    "requestName": "container-0-request-0"}]}}}
    device = dra_pb2.Device(request_names=["container-0-request-0"], pool_name="n",
                            device_name="gpu-0-mig-1g10gb-0", cdi_device_ids=["vendor/c=1"])
    info = ClaimInfo(DRIVER, dra_pb2.Claim(uid="c"), devices=[device], prepared=True)
    got = container_devices(pod, {EXTENDED: "c"}, {"c": info})
    assert got == {"first": [], "second": ["vendor/c=1"]}
    # A mapping naming a resource the container does not request gives it nothing.
    pod["spec"]["containers"][1] = {"name": "second"}
    assert container_devices(pod, {EXTENDED: "c"}, {"c": info}) == {"first": [], "second": []}


def test_kubelet_admission_skips_what_the_status_maps_to_dra() -> None:
    body = {"metadata": {"uid": "u", "name": "p", "namespace": "d"}, "spec": {"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1",
                                               "example.com/other": "1"}}}]},
        "status": {"extendedResourceClaimStatus": {"resourceClaimName": "x", "requestMappings": [
            {"containerName": "a", "resourceName": "nvidia.com/mig-1g.10gb",
             "requestName": "container-0-request-1"}]}}}
    requests = device_requests(pod_from_manifest(body))
    assert [(r.container, r.resource) for r in requests] == [("a", "example.com/other")]


# -- end to end: the real DRA allocator, the simulated scheduler and kubelet -------------------

async def test_an_unchanged_pod_spec_runs_through_dra_and_its_claim_goes_with_it(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig) as stack, \
            control_plane(stack, kubeconfig) as (core, resource, _, kubelet):
        install(resource)
        core.create_namespaced_pod(NAMESPACE, unchanged_pod("plain"))
        await until(lambda: phase(core, "plain") == "Running", "the unchanged Pod runs")
        body = raw(core.read_namespaced_pod, "plain", NAMESPACE)
        status = body["status"]["extendedResourceClaimStatus"]
        name = status["resourceClaimName"]
        assert name.startswith("plain-extended-resources-")
        assert {(m["containerName"], m["requestName"]) for m in status["requestMappings"]} == {
            ("a", "container-1-request-1"), ("b", "container-2-request-0")}
        claim = raw(resource.read_namespaced_resource_claim, name, NAMESPACE)
        assert claim["metadata"]["annotations"][extended.ANNOTATION] == "true"
        assert claim["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
        results = {r["request"]: r["device"]
                   for r in claim["status"]["allocation"]["devices"]["results"]}
        assert results["container-1-request-1"].startswith("gpu-0-mig-1g10gb-")
        assert results["container-2-request-0"].startswith("gpu-0-mig-2g20gb-")
        cdi = kubelet.workers[body["metadata"]["uid"]].cdi
        (a,), (b,) = cdi["a"], cdi["b"]
        assert results["container-1-request-1"] in a and results["container-2-request-0"] in b
        assert cdi["setup"] == []
        profiles = sorted(c.profile for c in await stack.claims())
        assert profiles == ["1g.10gb", "2g.20gb"]
        assert sorted(i.profile for i in await stack.instances()) == profiles

        uid = body["metadata"]["uid"]
        core.delete_namespaced_pod("plain", NAMESPACE)
        await stack.watcher.add(stack.watcher.record(uid, "plain", {}))
        await stack.watcher.gone(uid)  # as the watcher reports it
        await until(lambda: not resource.list_namespaced_resource_claim(
            NAMESPACE, field_selector=f"metadata.name={name}").items,
            "the special claim is deleted with its Pod")

        async def destroyed() -> bool:
            return not await stack.instances() and not await stack.claims()
        await until(destroyed, "both partitions destroyed and their claims removed")


async def test_without_the_device_classes_an_unchanged_pod_stays_pending(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig) as stack, \
            control_plane(stack, kubeconfig) as (core, resource, _, _):
        core.create_namespaced_pod(NAMESPACE, unchanged_pod("plain"))

        def refused() -> bool:
            conditions = core.read_namespaced_pod("plain", NAMESPACE).status.conditions or []
            return any("Insufficient nvidia.com/mig-1g.10gb" in (c.message or "")
                       for c in conditions)
        await until(refused, "the scheduler says no device plugin or class serves it")
        assert phase(core, "plain") == "Pending"
        assert not resource.list_namespaced_resource_claim(NAMESPACE).items
        assert not await stack.claims()

