"""`partkeeper_partition_info` on a running stack, both modes: the allocator process's real
/metrics (PK_METRICS_PORT) shows a series per partition once its Pod is admitted, naming the
partition as the driver lists it and the Pod as the API server has it; the series is gone once
the partition is reclaimed, and an allocator started again shows the same series (in DRA mode
once it has listed the ResourceClaims and read their Pods again)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from kubernetes import client, config

from partkeeper.dra import DRIVER
from partkeeper.telemetry.partitions import LABELS
from partkeeper_sim.driver import SimDriver
from partkeeper_sim.stack.kube import NAMESPACE, Kube
from partkeeper_sim.stack.natsserver import free_port
from tests_support import until
from tests_support.observability import scrape
from tests_support.rig import Rig, open_rig

PROFILE = "1g.10gb"
DEADLINE = 60.0  # the whole stack on two busy cores; a bound, never an expectation
pytestmark = pytest.mark.timeout(400)


def partitions(port: int) -> list[dict[str, str]]:
    """The partkeeper_partition_info series the allocator exposes, as label dicts."""
    found = []
    for (name, labels), value in scrape(port).items():
        if name == "partkeeper_partition_info":
            assert value == 1
            found.append(dict(labels))
    return found


def hardware(rig: Rig) -> dict[str, tuple[str, int, int, str, str]]:
    """MIG UUID -> (card UUID, GI id, CI id, profile, the card's index) as the driver lists."""
    driver = SimDriver(rig.stack.layout.cluster.sim_state)
    return {i.uuid: (card.uuid, i.gi_id, i.ci_id, i.profile, str(card.index))
            for card in driver.cards() if card.mode == "partition"
            for i in driver.instances(card.index)}


def expected(rig: Rig, pod: str, container: str) -> dict[str, str]:
    [(mig, (card_uuid, gi, ci, profile, _))] = hardware(rig).items()
    return {"uuid": mig, "gpu_instance_id": str(gi), "compute_instance_id": str(ci),
            "card_uuid": card_uuid, "profile": profile, "pod": pod, "namespace": NAMESPACE,
            "container": container}


@pytest.fixture
def port() -> Iterator[int]:
    yield free_port()


async def running(core: client.CoreV1Api, name: str) -> bool:
    resp = await asyncio.to_thread(core.read_namespaced_pod, name, NAMESPACE,
                                   _preload_content=False)
    status = json.loads(resp.data).get("status") or {}
    assert status.get("phase") != "Failed", f"Pod {name} failed: {status}"
    return status.get("phase") == "Running"


async def test_device_plugin_partitions_are_shown_with_their_pod_until_reclaimed(
        port: int) -> None:
    async with open_rig(overrides={"allocator": {"PK_METRICS_PORT": str(port)}}) as rig:
        kube = Kube(rig.stack.kubeconfig, rig.stack.node)
        try:
            assert partitions(port) == []
            await kube.create("train-0", f"{rig.stack.config.resource_prefix}{PROFILE}")
            await kube.bind("train-0")
            await until(lambda: running(kube.api, "train-0"), "train-0 Running", DEADLINE)
            await until(lambda: partitions(port), "a partition series", DEADLINE)
            [shown] = partitions(port)
            assert set(shown) == set(LABELS)
            assert shown == expected(rig, "train-0", "main")

            # A restart rebuilds the series from the store and the driver.
            await rig.restart("allocator")
            await until(lambda: partitions(port) == [shown], "the series after a restart",
                        DEADLINE)

            await kube.delete("train-0")
            await until(lambda: not hardware(rig), "the partition destroyed", DEADLINE)
            await until(lambda: partitions(port) == [], "the series gone", DEADLINE)
        finally:
            kube.close()


def _claim(name: str) -> dict[str, Any]:
    selector = f'device.attributes["{DRIVER}"].profile == "{PROFILE}"'
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [{
        "name": "gpu", "exactly": {"deviceClassName": DRIVER,
                                   "selectors": [{"cel": {"expression": selector}}]}}]}}}


def _pod(name: str, claim: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "server", "image": "cuda-sample",
                        "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}


async def test_dra_partitions_are_shown_with_the_pods_using_the_claim_until_it_ends(
        port: int) -> None:
    overrides = {"allocator": {"PK_METRICS_PORT": str(port)}}
    async with open_rig(mode="dra", overrides=overrides) as rig:
        api = config.new_client_from_config(config_file=str(rig.stack.kubeconfig))
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)

        async def call(method: Any, *args: Any) -> Any:
            return await asyncio.to_thread(method, *args)

        try:
            await call(resource.create_namespaced_resource_claim, NAMESPACE, _claim("shared"))
            for name in ("infer-a", "infer-b"):
                await call(core.create_namespaced_pod, NAMESPACE, _pod(name, "shared"))
            for name in ("infer-a", "infer-b"):
                await until(partial(running, core, name), f"{name} Running", DEADLINE)
            device = {k: v for k, v in expected(rig, "", "").items()
                      if k not in ("pod", "container")}

            last: list[object] = []

            def users() -> set[tuple[str, str]]:
                shown = partitions(port)
                last[:] = [shown]  # said when a wait fails
                assert all(set(s) == set(LABELS) for s in shown), shown
                assert all({k: s[k] for k in device} == device for s in shown), shown
                return {(s["pod"], s["container"]) for s in shown}

            both = {("infer-a", "server"), ("infer-b", "server")}
            try:
                await until(lambda: users() == both, f"series for {both}", DEADLINE)
            except AssertionError as exc:
                body = await call(resource.read_namespaced_resource_claim, "shared", NAMESPACE)
                raise AssertionError(f"{exc}; last scraped: {last}; reserved for "
                                     f"{body.status.reserved_for}") from exc

            # A restart rebuilds them: the store and the driver for the partition, the
            # ResourceClaim watch's LIST and the Pods for its users.
            await rig.restart("allocator")
            await until(lambda: users() == both, "the series after a restart", DEADLINE)

            # infer-a ends: the claim serves infer-b alone, on the same partition.
            await call(core.delete_namespaced_pod, "infer-a", NAMESPACE)
            await until(lambda: users() == {("infer-b", "server")}, "infer-b's series alone",
                        DEADLINE)
            assert hardware(rig).keys() == {device["uuid"]}

            await call(core.delete_namespaced_pod, "infer-b", NAMESPACE)
            await call(resource.delete_namespaced_resource_claim, "shared", NAMESPACE)
            await until(lambda: not hardware(rig), "the partition destroyed", DEADLINE)
            await until(lambda: partitions(port) == [], "the series gone", DEADLINE)
        finally:
            api.close()
