"""The simulated scheduler and the simulated kubelet's DRA side with the real DRA allocator:
a 7g.80gb and 1g.10gb Pods on one card never over-admit, and the waiting one is placed as soon
as the partition it waits for is destroyed."""

from __future__ import annotations

import logging
from typing import Any

from tests_support import until
from tests_support.dra import NAMESPACE, control_plane, dra_node, phase


def pod_body(name: str, template: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"claims": [{"name": "mig"}]}}],
        "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}]}}


async def test_big_and_small_on_one_card_wait_instead_of_failing(
    nc, js, node, kubeconfig, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="services.allocator.core.reclaimer")
    async with dra_node(nc, node, kubeconfig) as stack, \
            control_plane(stack, kubeconfig) as (core, resource, scheduler, kubelet):
        await until(lambda: bool(kubelet.plugins), "kubelet registered the DRA plugin")
        core.create_namespaced_pod(NAMESPACE, pod_body("big", "mig-7g-80gb"))
        await until(lambda: phase(core, "big") == "Running", "the 7g.80gb Pod runs")
        core.create_namespaced_pod(NAMESPACE, pod_body("small", "mig-1g-10gb"))
        await until(lambda: any(c.reason == "Unschedulable" for c in
                                core.read_namespaced_pod("small", NAMESPACE).status.conditions
                                or []), "the 1g.10gb Pod is unschedulable")
        assert phase(core, "small") == "Pending"
        assert not core.read_namespaced_pod("small", NAMESPACE).spec.node_name
        (claim,) = await stack.claims()
        assert claim.profile == "7g.80gb" and claim.resource_claim.startswith("default/big-mig-")

        core.delete_namespaced_pod("big", NAMESPACE)
        await until(lambda: not core.list_namespaced_pod(
            NAMESPACE, field_selector="metadata.name=big").items, "the big Pod is gone")
        assert kubelet.unprepare_calls >= 1
        passes = scheduler.passes
        await until(lambda: scheduler.passes >= passes + 3, "the scheduler passes again")
        assert phase(core, "small") == "Pending", "room is free only once the hardware is"
        # The claim's deletion released it and the allocator asked reclaim.now, which the
        # stand-in refuses while it knows nothing of the Pod; once that answer is in, the test
        # plays the reclaimer's event path.
        await until(lambda: any("reclaim.now: refused" in r.getMessage()
                                for r in caplog.records), "reclaim.now was asked and answered")
        await stack.watcher.add(stack.watcher.record(claim.pod_uid, "big", {}))
        await stack.watcher.gone(claim.pod_uid)
        await stack.reclaimer.reclaim(claim)  # the reclaimer's destroy, as its event path does
        await until(lambda: phase(core, "small") == "Running",
                    "the 1g.10gb Pod runs once the 7g.80gb partition is destroyed")
        (now,) = await stack.claims()
        assert now.profile == "1g.10gb" and now.state == "active"
        assert [i.profile for i in await stack.instances()] == ["1g.10gb"]
        assert not resource.list_namespaced_resource_claim(
            NAMESPACE, field_selector=f"metadata.name={claim.resource_claim.split('/')[1]}").items
