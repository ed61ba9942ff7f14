"""NodePrepareResources / NodeUnprepareResources against the DRA allocator: real NATS, real
gRPC on the plugin's sockets, the simulated API server through the real client, sim cards."""

from __future__ import annotations

import json
import uuid

from partkeeper.dra import DRIVER
from partkeeper.health import HEALTH
from partkeeper.kubelet import dra_registration_pb2, dra_registration_pb2_grpc, open_unix_channel
from tests_support import until
from tests_support.dra import dra_node


def uid() -> str:
    return str(uuid.uuid4())


async def test_registration_answers_as_kubelet_expects(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        await until(lambda: "kubelet registration" in HEALTH.readiness()[1], "readiness check")
        assert HEALTH.readiness()[1]["kubelet registration"] is False
        async with open_unix_channel(stack.registration_socket) as channel:
            stub = dra_registration_pb2_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(dra_registration_pb2.InfoRequest())
            await stub.NotifyRegistrationStatus(
                dra_registration_pb2.RegistrationStatus(plugin_registered=True))
        assert HEALTH.readiness()[1]["kubelet registration"] is True
        assert info.type == "DRAPlugin" and info.name == DRIVER
        assert info.endpoint == str(stack.service_socket)
        assert info.supported_versions[0] == "v1.DRAPlugin"  # then the health versions
        assert oct(stack.service_socket.stat().st_mode & 0o777) == "0o600"


async def test_prepare_creates_at_the_allocated_placement_and_returns_cdi_ids(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        await until(lambda: _has(stack, "gpu-0-mig-1g10gb-6"), "the slices offer 1g.10gb at 6")
        ref = await stack.allocated("c1", "gpu-0-mig-1g10gb-6", uid(), "p1")
        answers = await stack.prepare(ref)
        answer = answers[ref.uid]
        assert answer.error == ""
        (device,) = answer.devices
        assert device.device_name == "gpu-0-mig-1g10gb-6" and device.pool_name == node
        (cid,) = device.cdi_device_ids
        (inst,) = await stack.instances()
        assert (inst.profile, inst.start) == ("1g.10gb", 6)
        (claim,) = await stack.claims()
        assert claim.state == "active" and claim.resource_claim_uid == ref.uid
        assert claim.resource_claim == "default/c1"
        assert claim.id == f"{ref.uid}.{device.device_name}"
        assert cid == f"partkeeper.io/partition={claim.id}"
        (spec_file,) = (stack.config.cdi_dir).iterdir()
        spec = json.loads(spec_file.read_text())
        env = spec["devices"][0]["containerEdits"]["env"]
        assert f"NVIDIA_VISIBLE_DEVICES={inst.uuid}" in env
        await until(lambda: _lacks(stack, "gpu-0-mig-7g80gb-0"),
                    "the slices no longer offer what the partition covers")


async def test_prepare_is_idempotent(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        ref = await stack.allocated("c1", "gpu-0-mig-3g40gb-4", uid(), "p1", "3g.40gb")
        first = (await stack.prepare(ref))[ref.uid]
        again = (await stack.prepare(ref))[ref.uid]
        both = await stack.prepare(ref, ref)
        assert first.error == "" and again == first and both[ref.uid] == first
        assert len(await stack.instances()) == 1 and len(await stack.claims()) == 1


async def test_claim_with_another_uid_prepares_nothing(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        ref = await stack.allocated("c1", "gpu-0-mig-1g10gb-0", uid(), "p1")
        stale = type(ref)(namespace=ref.namespace, name=ref.name, uid=uid())
        answer = (await stack.prepare(stale))[stale.uid]
        assert "deleted and re-created" in answer.error and not answer.devices
        assert await stack.instances() == [] and await stack.claims() == []


async def test_unallocated_or_unreserved_claims_prepare_nothing(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        from tests_support.dra import claim_body

        made = stack.api.create_namespaced_resource_claim("default", claim_body("bare",
                                                                                  "1g.10gb"))
        ref = type(await stack.allocated("c1", "gpu-0-mig-1g10gb-0", uid(), "p1"))(
            namespace="default", name="bare", uid=made.metadata.uid)
        assert "not allocated" in (await stack.prepare(ref))[ref.uid].error
        stack.api.patch_namespaced_resource_claim_status("bare", "default", {"status": {
            "allocation": {"devices": {"results": [{"request": "mig", "driver": DRIVER,
                                                    "pool": node,
                                                    "device": "gpu-0-mig-1g10gb-1"}]}}}})
        assert "reserved for no Pod" in (await stack.prepare(ref))[ref.uid].error
        assert await stack.instances() == []


async def test_device_on_a_foreign_partition_is_refused_and_the_foreign_one_kept(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        ref = await stack.allocated("c1", "gpu-0-mig-1g10gb-2", uid(), "p1")
        from partkeeper.drivers import InstanceSpec

        foreign = stack.driver.create(InstanceSpec(0, "2g.20gb", 2))
        await until(lambda: _lacks(stack, "gpu-0-mig-1g10gb-2"),
                    "the slices withdraw what the foreign partition covers")
        answer = (await stack.prepare(ref))[ref.uid]
        assert answer.error and not answer.devices
        assert [i.uuid for i in await stack.instances()] == [foreign.uuid]
        assert await stack.claims() == []


async def test_unprepare_records_and_the_deallocation_releases(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        pod = uid()
        ref = await stack.allocated("c1", "gpu-0-mig-1g10gb-0", pod, "p1")
        assert (await stack.prepare(ref))[ref.uid].error == ""
        assert (await stack.unprepare(ref))[ref.uid].error == ""
        (claim,) = await stack.claims()
        assert claim.state == "active" and claim.unprepared_at > 0, \
            "unprepare only records: the claim is still allocated"
        assert list(stack.config.cdi_dir.iterdir()) == []
        stack.api.patch_namespaced_resource_claim_status(
            "c1", "default", {"status": {"allocation": None, "reservedFor": None}})
        await until(_released(stack), "the deallocated, unprepared claim is released")
        (claim,) = await stack.claims()
        assert "no longer allocated" in claim.release_reason
        await until(lambda: [claim.id] in stack.reclaimer.asked,
                    "the reclaimer is asked to destroy it at once (it alone destroys)")


async def test_prepared_again_after_unprepare_clears_the_mark(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        ref = await stack.allocated("c1", "gpu-0-mig-1g10gb-0", uid(), "p1")
        assert (await stack.prepare(ref))[ref.uid].error == ""
        assert (await stack.unprepare(ref))[ref.uid].error == ""
        assert (await stack.prepare(ref))[ref.uid].error == ""
        (claim,) = await stack.claims()
        assert claim.state == "active" and claim.unprepared_at == 0
        assert len(list(stack.config.cdi_dir.iterdir())) == 1


async def test_a_deleted_resource_claim_releases_its_partition(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        ref = await stack.allocated("c1", "gpu-0-mig-1g10gb-0", uid(), "p1")
        assert (await stack.prepare(ref))[ref.uid].error == ""
        assert (await stack.unprepare(ref))[ref.uid].error == ""
        stack.api.delete_namespaced_resource_claim("c1", "default")
        await until(_released(stack), "the deleted claim's partition is released")
        (claim,) = await stack.claims()
        assert "was deleted" in claim.release_reason


def _released(stack):
    """The claims are all releasing (the stand-in reclaimer destroys only for a dead Pod, and
    the Pods here stay live, so they stay)."""
    async def check() -> bool:
        claims = await stack.claims()
        return bool(claims) and all(c.state == "releasing" for c in claims)
    return check


def _has(stack, name: str):
    async def check() -> bool:
        return name in await stack.offered()
    return check


def _lacks(stack, name: str):
    async def check() -> bool:
        offered = await stack.offered()
        return bool(offered) and name not in offered
    return check
