"""Who uses a ResourceClaim (partkeeper/telemetry/claimusers.py): pure readings of the claim's
`status.reservedFor` and of a Pod's claims, each case of the API's shapes, and what is not one."""

from __future__ import annotations

from typing import Any

import pytest

from partkeeper.telemetry.claimusers import PodRef, containers_using, reservation
from services.allocator.dra.users import in_pool

A = "11111111-1111-4111-8111-111111111111"
B = "22222222-2222-4222-8222-222222222222"


def claim(reserved: list[dict[str, Any]] | None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"uid": "rc-1", "namespace": "ml", "name": "shared"},
            "status": {"reservedFor": reserved, **status}}


def ref(uid: str, name: str, **fields: str) -> dict[str, str]:
    return {"resource": "pods", "uid": uid, "name": name, **fields}


def test_every_reserving_pod_once_in_order() -> None:
    found = reservation(claim([ref(B, "b"), ref(A, "a"), ref(A, "a")]))
    assert found is not None
    assert (found.uid, found.namespace, found.name) == ("rc-1", "ml", "shared")
    assert found.pods == (PodRef(A, "a"), PodRef(B, "b"))


@pytest.mark.parametrize("entry", [
    ref(A, "a", apiGroup="batch"),  # not the core group's Pods
    {"resource": "jobs", "uid": A, "name": "a"},
    {"resource": "pods", "name": "a"},  # no UID
    "pods/a",
])
def test_what_is_no_pod_reservation_is_left_out(entry: Any) -> None:
    found = reservation(claim([entry]))
    assert found is not None and found.pods == ()


@pytest.mark.parametrize("body", [None, [], {"metadata": {"name": "x"}}, {"metadata": "x"}])
def test_what_is_no_resource_claim_reads_as_none(body: Any) -> None:
    assert reservation(body) is None


def test_an_unreserved_claim_has_no_pods() -> None:
    found = reservation(claim(None))
    assert found is not None and found.pods == ()


def pod(**status: Any) -> dict[str, Any]:
    return {"metadata": {"uid": A}, "spec": {
        "initContainers": [{"name": "warm", "resources": {"claims": [{"name": "gpu"}]}}],
        "containers": [
            {"name": "server", "resources": {"claims": [{"name": "gpu", "request": "mig"}]}},
            {"name": "sidecar"},
            {"name": "other", "resources": {"claims": [{"name": "scratch"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"},
                           {"name": "scratch", "resourceClaimTemplateName": "t"}]},
        "status": status}


def test_containers_naming_the_claims_entry_use_it_init_containers_first() -> None:
    assert containers_using(pod(), "shared") == ("warm", "server")


def test_a_claim_made_from_a_template_is_found_by_the_name_the_pod_status_gives() -> None:
    made = pod(resourceClaimStatuses=[{"name": "scratch", "resourceClaimName": "p-scratch-x"}])
    assert containers_using(made, "p-scratch-x") == ("other",)
    assert containers_using(pod(), "p-scratch-x") == ()  # not made yet


def test_the_extended_resources_claim_names_its_containers_in_request_mappings() -> None:
    mappings = [{"containerName": "sidecar", "resourceName": "nvidia.com/mig-1g.10gb",
                 "requestName": "container-1-request-0"}]
    body = pod(extendedResourceClaimStatus={"resourceClaimName": "p-extended-y",
                                            "requestMappings": mappings})
    assert containers_using(body, "p-extended-y") == ("sidecar",)


@pytest.mark.parametrize("body", [None, {}, {"spec": "x"}, {"spec": {"containers": "x"}}])
def test_what_is_no_pod_uses_nothing(body: Any) -> None:
    assert containers_using(body, "shared") == ()


def test_only_claims_allocated_in_this_nodes_pool_are_followed() -> None:
    def allocated(driver: str, pool: str) -> dict[str, Any]:
        return claim([], allocation={"devices": {"results": [
            {"driver": driver, "pool": pool, "device": "gpu-0-mig-1g10gb-0"}]}})

    assert in_pool(allocated("partitions.partkeeper.io", "node-1"), "node-1")
    assert not in_pool(allocated("partitions.partkeeper.io", "node-2"), "node-1")
    assert not in_pool(allocated("gpu.nvidia.com", "node-1"), "node-1")
    assert not in_pool(claim([]), "node-1")
    assert not in_pool("x", "node-1")
