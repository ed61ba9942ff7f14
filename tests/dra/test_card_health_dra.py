"""Card health in DRA mode, with the real DRA allocator, the simulated API server, scheduler and
kubelet: a failed card's free devices carry the taint `partitions.partkeeper.io/unhealthy`
(NoSchedule) on a server that keeps device taints (1.37 on), or are withdrawn before; the
scheduler, which honours taints as upstream's structured allocator does, places no claim there;
prepare refuses a new device on it; the Pods already there keep their partitions."""

from __future__ import annotations

import asyncio
from typing import Any

from partkeeper.dra.slices import TAINT_KEY
from partkeeper_sim.scheduler.allocate import tolerated
from tests_support import until
from tests_support.dra import NAMESPACE, DraNode, control_plane, dra_node, phase

TWO = ("H100-80GB", "H100-80GB")


def pod_body(name: str, template: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"claims": [{"name": "mig"}]}}],
        "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}]}}


async def claims(stack: DraNode) -> list[Any]:
    docs = await stack.store.read_all([0, 1])
    return [c for card in sorted(docs) for c in docs[card][0].claims.values()]


async def tainted(stack: DraNode) -> dict[str, list[dict[str, Any]]]:
    items = await stack.slices()
    top = max(s.spec.pool.generation for s in items)
    return {d.name: [t.to_dict() for t in d.taints or []]
            for s in items if s.spec.pool.generation == top for d in s.spec.devices or []}


async def test_a_failed_card_is_tainted_and_the_scheduler_places_nothing_there(
    nc, js, node, kubeconfig, apiserver
) -> None:
    apiserver._state.kubernetes_version = "1.37"
    async with dra_node(nc, node, kubeconfig, cards=TWO) as stack, \
            control_plane(stack, kubeconfig) as (core, _, _, kubelet):
        await until(lambda: bool(kubelet.plugins), "kubelet registered the DRA plugin")
        core.create_namespaced_pod(NAMESPACE, pod_body("a", "mig-1g-10gb"))
        await until(lambda: phase(core, "a") == "Running", "Pod a runs")
        [claim_a] = await claims(stack)
        assert claim_a.card == 0 and claim_a.instance is not None
        stack.driver.fail_card(0, 48)

        async def card_0_tainted() -> bool:
            devices = await tainted(stack)
            on_0 = [t for name, t in devices.items() if name.startswith("gpu-0-")]
            on_1 = [t for name, t in devices.items() if name.startswith("gpu-1-")]
            return bool(on_0) and all(
                [(x["key"], x["effect"], x["value"]) for x in t] == [
                    (TAINT_KEY, "NoSchedule", "xid-48")] for t in on_0) and not any(on_1)

        await until(card_0_tainted, "card 0's free devices carry the taint, card 1's none")
        core.create_namespaced_pod(NAMESPACE, pod_body("b", "mig-1g-10gb"))
        await until(lambda: phase(core, "b") == "Running", "Pod b runs")
        by_pod = {c.resource_claim.split("/")[1].split("-mig-")[0]: c for c in await claims(stack)}
        assert by_pod["b"].card == 1  # first fit would take card 0; the taint keeps it off
        assert (by_pod["a"].id, by_pod["a"].state) == (claim_a.id, "active")
        assert claim_a.instance.uuid in {i.uuid for i in await stack.instances(0)}


async def test_before_1_37_a_failed_cards_devices_are_withdrawn_and_prepare_refuses(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig, cards=TWO) as stack:
        await until(lambda: stack.offered(), "the devices are published")
        stack.driver.fail_card(0, 79)  # lost

        async def withdrawn() -> bool:
            names = await stack.offered()
            return bool(names) and not any(n.startswith("gpu-0-") for n in names)

        await until(withdrawn, "card 0's devices are withdrawn, card 1's stay")
        assert not any((await tainted(stack)).values())  # a 1.35 server is sent no taint
        # A scheduler that allocated a device of the card before it failed: nothing prepared.
        ref = await stack.allocated("late", "gpu-0-mig-1g10gb-0", "uid-late", "late")
        answer = (await stack.prepare(ref))[ref.uid]
        assert "card 0, which has failed" in answer.error
        assert await claims(stack) == []
        await asyncio.to_thread(stack.driver.recover_card, 0)
        await until(lambda: _offers_card_0(stack), "card 0 is offered again once recovered")


async def _offers_card_0(stack: DraNode) -> bool:
    return any(n.startswith("gpu-0-") for n in await stack.offered())


def test_tolerations_as_the_structured_allocator_matches_them() -> None:
    taint = {"key": TAINT_KEY, "value": "xid-48", "effect": "NoSchedule"}
    device = {"name": "d", "taints": [taint]}
    assert tolerated({"name": "clean"}, [])
    assert not tolerated(device, [])
    assert tolerated(device, [{"operator": "Exists"}])
    assert tolerated(device, [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}])
    assert tolerated(device, [{"key": TAINT_KEY, "value": "xid-48"}])
    assert not tolerated(device, [{"key": TAINT_KEY, "value": "lost"}])
    assert not tolerated(device, [{"key": TAINT_KEY, "operator": "Exists",
                                   "effect": "NoExecute"}])
