"""Device health in the Pod's own status (KEP-4680) on the whole stack, one test per mode: real
NATS, the four services as processes, the simulated API server and kubelet. A card's XID
(`partkeeper sim fail`) shows in `status.containerStatuses[].allocatedResourcesStatus` as
Unhealthy within 2 s, naming the card and the XID in DRA mode, and `partkeeper sim recover` makes
it Healthy again."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes import client, config

from partkeeper.dra import DRIVER
from partkeeper_sim.driver import SimDriver
from partkeeper_sim.stack import dra_demo
from partkeeper_sim.stack.launch import NODE, Stack
from tests_support import until
from tests_support.rig import open_rig
from tests_support.stack import run_cli

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

NAMESPACE = dra_demo.NAMESPACE
PROFILE = "1g.10gb"
SEEN_WITHIN = 2.0  # the requirement: the Pod's status shows the event within 2 s


def entries(pod: Any) -> list[dict[str, Any]]:
    """The Pod's allocatedResourcesStatus entries, as the API server stores them."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return [e for s in statuses for e in s.get("allocatedResourcesStatus") or []]


def healths(pod: Any) -> set[str]:
    return {r["health"] for e in entries(pod) for r in e["resources"]}


class Cluster:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.api_client = config.new_client_from_config(config_file=str(stack.kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.resource = client.ResourceV1Api(self.api_client)
        self.state = str(stack.layout.cluster.sim_state)

    async def pod(self, name: str) -> dict[str, Any]:
        """The stored object, read raw: what `kubectl get pod -o yaml` prints."""
        answer = await asyncio.to_thread(self.core.read_namespaced_pod, name, NAMESPACE,
                                         _preload_content=False)
        return dict(json.loads(answer.data))

    async def card_of_the_partition(self) -> int:
        driver = SimDriver(self.stack.layout.cluster.sim_state)
        cards = await asyncio.to_thread(driver.cards)
        found = [c.index for c in cards if await asyncio.to_thread(driver.instances, c.index)]
        assert len(found) == 1, found
        return found[0]

    async def sim(self, *args: str) -> None:
        await asyncio.to_thread(run_cli, ["sim", *args, "--state", self.state, "--json"])


async def device_plugin_pod(c: Cluster, name: str) -> None:
    resource = c.stack.config.resource_prefix + PROFILE
    body = {"metadata": {"name": name}, "spec": {
        "nodeName": NODE, "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "cuda-sample",
                        "resources": {"limits": {resource: "1"}}}]}}
    await asyncio.to_thread(c.core.create_namespaced_pod, NAMESPACE, body)


async def dra_pod(c: Cluster, name: str) -> None:
    await dra_demo.published(c.stack.kubeconfig, NODE)
    await asyncio.to_thread(c.resource.create_namespaced_resource_claim_template, NAMESPACE,
                            dra_demo._template(PROFILE))
    await asyncio.to_thread(c.core.create_namespaced_pod, NAMESPACE, dra_demo._pod(name, PROFILE))


@pytest.mark.parametrize("xid", [79, 48], ids=["xid 79 (lost)", "xid 48 (ECC)"])
@pytest.mark.parametrize("mode", ["deviceplugin", "dra"])
async def test_a_pods_status_shows_its_card_failing_and_recovering(mode: str, xid: int) -> None:
    async with open_rig(mode=mode) as rig:
        c = Cluster(rig.stack)
        try:
            await (dra_pod if mode == "dra" else device_plugin_pod)(c, "worker")

            async def shown_healthy() -> bool:
                pod = await c.pod("worker")
                return pod["status"].get("phase") == "Running" and healths(pod) == {"Healthy"}

            await until(shown_healthy, "the running Pod's device shown Healthy in its status")
            (entry,) = entries(await c.pod("worker"))
            (device,) = entry["resources"]
            if mode == "dra":
                assert entry["name"] == "claim:mig"
                pool, name = device["resourceID"].split("/")[1:]
                assert device["resourceID"] == f"{DRIVER}/{NODE}/{name}" and pool == NODE
            else:
                assert entry["name"] == c.stack.config.resource_prefix + PROFILE
            card = await c.card_of_the_partition()

            await c.sim("fail", "--card", str(card), "--xid", str(xid))

            async def shown_unhealthy() -> bool:
                return healths(await c.pod("worker")) == {"Unhealthy"}

            await until(shown_unhealthy, f"the Pod's device Unhealthy after XID {xid}",
                        timeout=SEEN_WITHIN)
            if mode == "dra":
                ((said,),) = [[r.get("message", "") for r in e["resources"]]
                              for e in entries(await c.pod("worker"))]
                assert f"card {card}" in said and f"XID {xid}" in said, said

            await c.sim("recover", "--card", str(card))
            await until(shown_healthy, "the Pod's device Healthy again after the recovery")
        finally:
            c.api_client.close()
