"""DRA mode against a kubelet, scheduler and API server that behave as Kubernetes 1.35/1.36 do
(issue 22): slices wiped by kubelet come back, a shared claim keeps its partition until its last
Pod is gone, a prioritized-list claim reaches its container, a quiet node writes no slices, and
an API server without DRAPartitionableDevices gets no devices at all."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubernetes import client

from partkeeper.dra import DRIVER
from services.reclaimer.decide import Sighting, Step, decide
from tests_support import until
from tests_support.dra import NAMESPACE, claim_body, control_plane, dra_node, phase


def pod(name: str, claims: list[dict[str, Any]], request: str | None = None) -> dict[str, Any]:
    ref = {"name": claims[0]["name"], **({"request": request} if request else {})}
    return {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {
        "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [ref]}}],
        "resourceClaims": claims}}


def versions(stack) -> dict[str, str]:
    items = stack.api.list_resource_slice(field_selector=f"spec.nodeName={stack.node}").items
    return {s.metadata.name: s.metadata.resource_version for s in items}


async def offering(stack) -> bool:
    return bool(await stack.offered())


async def test_slices_kubelet_wipes_at_start_and_after_an_unusable_plugin_come_back(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        await until(lambda: offering(stack), "the node's slices are published")
        async with control_plane(stack, kubeconfig, wipe_delay=0.2) as (_, _, _, kubelet):
            await until(lambda: kubelet.registry.wiped > 0, "kubelet wiped the node's slices")
            await until(lambda: offering(stack), "the publisher restored them, nothing else "
                        "having changed")
            await until(lambda: bool(kubelet.plugins), "kubelet registered the plugin")
            wiped = kubelet.registry.wiped
            stack.registration_socket.unlink()  # the plugin is unusable to kubelet from now
            await until(lambda: kubelet.registry.wiped > wiped,
                        "kubelet wiped the driver's slices once the plugin stayed unusable")
            await until(lambda: offering(stack), "the publisher restored them again")
            owners = {(o.kind, o.name, o.controller)
                      for s in await stack.slices() for o in s.metadata.owner_references}
            assert owners == {("Node", stack.node, True)}


async def test_a_shared_claim_keeps_its_partition_until_its_last_pod_is_gone(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig) as stack, \
            control_plane(stack, kubeconfig) as (core, resource, _, kubelet):
        resource.create_namespaced_resource_claim(NAMESPACE, claim_body("shared", "1g.10gb"))
        entry = [{"name": "mig", "resourceClaimName": "shared"}]
        core.create_namespaced_pod(NAMESPACE, pod("first", entry))
        await until(lambda: phase(core, "first") == "Running", "the first Pod runs")
        core.create_namespaced_pod(NAMESPACE, pod("second", entry))
        await until(lambda: phase(core, "second") == "Running", "the second Pod runs")
        reserved = resource.read_namespaced_resource_claim("shared", NAMESPACE).status
        assert len(reserved.reserved_for) == 2
        assert kubelet.prepare_calls == 1, "kubelet prepares a claim once, not once per Pod"
        (claim,) = await stack.claims()
        first_uid = claim.pod_uid

        core.delete_namespaced_pod("first", NAMESPACE)
        await stack.watcher.add(stack.watcher.record(first_uid, "first", {}))
        await stack.watcher.gone(first_uid)  # as the watcher reports it
        await until(lambda: not core.list_namespaced_pod(
            NAMESPACE, field_selector="metadata.name=first").items, "the first Pod is gone")
        await until(lambda: len(resource.read_namespaced_resource_claim(
            "shared", NAMESPACE).status.reserved_for or []) == 1, "only the second is reserved")
        assert kubelet.unprepare_calls == 0, "the second Pod still uses the claim"
        (claim,) = await stack.claims()
        assert claim.state == "active" and len(await stack.instances()) == 1
        verdict = decide(claim, Sighting(listed=False), "gone", 0.0, create_timeout=30)
        assert verdict.step is Step.KEEP, "the reclaimer does not act on the first Pod's end"
        assert kubelet.workers[claim_pod(core, "second")].cdi["main"]

        core.delete_namespaced_pod("second", NAMESPACE)
        await until(lambda: kubelet.unprepare_calls == 1, "unprepared after the last Pod")
        await until(lambda: [claim.id] in stack.reclaimer.asked,
                    "released once unprepared and deallocated, and the reclaimer asked")

        async def destroyed() -> bool:
            return not await stack.instances() and not await stack.claims()
        await until(destroyed, "the partition destroyed and its claim removed")


def claim_pod(core, name: str) -> str:
    return core.read_namespaced_pod(name, NAMESPACE).metadata.uid


async def test_a_prioritized_list_claim_reaches_its_container(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack, \
            control_plane(stack, kubeconfig) as (core, resource, _, kubelet):
        selector = f'device.attributes["{DRIVER}"].profile == "%s"'
        subrequests = [{"name": f"p{i}", "deviceClassName": DRIVER,
                        "selectors": [{"cel": {"expression": selector % profile}}]}
                       for i, profile in enumerate(("2g.20gb", "1g.10gb"))]
        resource.create_namespaced_resource_claim(NAMESPACE, {
            "metadata": {"name": "either"},
            "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": subrequests}]}}})
        entry = [{"name": "gpu", "resourceClaimName": "either"}]
        core.create_namespaced_pod(NAMESPACE, pod("picky", entry, request="gpu"))
        await until(lambda: phase(core, "picky") == "Running", "the Pod runs")
        allocation = resource.read_namespaced_resource_claim("either", NAMESPACE).status.allocation
        (result,) = allocation.devices.results
        assert result.request == "gpu/p0" and result.device.startswith("gpu-0-mig-2g20gb-")
        cdi = kubelet.workers[claim_pod(core, "picky")].cdi
        assert cdi["main"], "kubelet matched the container's request `gpu` to the device"


async def test_a_quiet_node_writes_no_slices_and_a_change_moves_one_generation(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        await until(lambda: offering(stack), "the node's slices are published")
        before = versions(stack)
        for i in range(5):  # unrelated Pods come and go: every one wakes the publisher
            record = stack.watcher.record(f"quiet-{i}", f"quiet-{i}", {})
            await stack.watcher.add(record)
            await stack.watcher.gone(record.uid)
        ref = await stack.allocated("c1", "gpu-0-mig-1g10gb-0", "pod-1", "p1")
        assert (await stack.prepare(ref))[ref.uid].error == ""

        async def withdrawn() -> bool:
            offered = await stack.offered()
            return bool(offered) and "gpu-0-mig-1g10gb-0" not in offered
        await until(withdrawn, "the prepared placement is withdrawn")
        generations = {s.spec.pool.generation for s in await stack.slices()}
        assert generations == {2}, "the quiet wake-ups wrote nothing; the claim moved one"
        after = versions(stack)
        assert set(after) == set(before)
        assert all(after[name] != before[name] for name in before if "devices" in name)


async def test_without_the_partitionable_devices_gate_no_device_is_published(
    nc, js, node, kubeconfig, apiserver, caplog
) -> None:
    apiserver.with_store(lambda store: setattr(store, "partitionable_devices", False))
    caplog.set_level(logging.ERROR)
    async with dra_node(nc, node, kubeconfig, wait_ready=False) as stack:
        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if "DRAPartitionableDevices" in r.getMessage()]

        await until(lambda: bool(said()), "the allocator names the feature gate")
        await until(lambda: not versions(stack), "every slice is withdrawn")
        history = apiserver.with_store(lambda store: store.changes_since("resourceslices", 1))
        assert history, "a counter slice was written, and its answer showed the gate"
        assert not any((c.obj.get("spec") or {}).get("devices") for c in history), \
            "no device was ever published without its counters"
        assert len(said()) == 1
        await asyncio.sleep(0)  # the allocator is still running, not ready: no plugin served
        assert not stack.task.done() and not stack.registration_socket.exists()


async def test_slices_follow_a_re_created_node_as_their_owner(nc, js, node, kubeconfig) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        await until(lambda: offering(stack), "the node's slices are published")
        core = client.CoreV1Api(stack.api.api_client)
        old = core.read_node(stack.node).metadata.uid
        core.delete_node(stack.node)
        new = core.read_node(stack.node).metadata.uid  # the kubelet registers it again
        assert new != old
        victim = next(iter(versions(stack)))
        stack.api.delete_resource_slice(victim)  # as the garbage collector does for the old UID

        async def owned_by_new() -> bool:
            slices = await stack.slices()
            return bool(slices) and all(o.uid == new for s in slices
                                        for o in s.metadata.owner_references)
        await until(owned_by_new, "every slice is owned by the re-created Node")
