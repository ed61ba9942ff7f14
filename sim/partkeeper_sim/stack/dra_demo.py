"""`partkeeper up --demo --mode dra`: the DRA scenario on the embedded stack (docs/dra.md).

Two 7g.80gb Pods and a 1g.10gb Pod are submitted together to a node with two empty H100-80GB
cards. The simulated scheduler, using only the published ResourceSlices, places what fits (two
of the three) and leaves the third Pending with the reason on the Pod; nothing is admitted and
then failed. One running Pod is deleted; the real watcher, reclaimer and allocator destroy its
partition and re-publish the slices, and the Pending Pod is placed and runs. `partkeeper status`
shows every claim with its ResourceClaim. Every Pod is deleted and the node must end with no
partition, no claim and every device offered again.

While two Pods run, one card reports a fatal XID: the Pods on it read Unhealthy in their own
status (`allocatedResourcesStatus`, from the plugin's resource-health stream through the
simulated kubelet), naming the card and the XID, and Healthy again once the card is reset.

Then one ResourceClaim with a prioritized list (`firstAvailable`: a 3g.40gb, else a 1g.10gb) is
shared by two Pods whose containers name its request: the scheduler allocates the first
subrequest (`gpu/p0`), both Pods run on the one partition, the partition outlives the first
Pod, and it is destroyed only after the last is gone and the claim is deallocated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from rich.console import Console

from partkeeper import status as node_status
from partkeeper.dra import DRIVER, devices
from partkeeper_sim.driver import SimDriver
from partkeeper_sim.stack.kube import health_line, health_words, resource_health
from partkeeper_sim.stack.launch import Stack

NAMESPACE = "partkeeper-demo"
MIX = (("big-a", "7g.80gb"), ("big-b", "7g.80gb"), ("small", "1g.10gb"))
STEP_SECONDS = 45.0
POLL = 0.05
FAILING_XID = 48  # a double-bit ECC error: fatal for the card, which keeps answering


class DemoFailed(Exception):
    pass


@dataclass
class DraOutcome:
    passed: bool = False
    lines: list[str] = field(default_factory=list)
    error: str = ""


async def wait_until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = STEP_SECONDS
                 ) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise DemoFailed(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(POLL)


async def published(kubeconfig: Path, node: str) -> None:
    """Return once the node's ResourceSlices of our driver are in the API server."""
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    api = client.ResourceV1Api(api_client)

    async def listed() -> bool:
        try:
            found = await asyncio.to_thread(api.list_resource_slice,
                                            field_selector=f"spec.nodeName={node}")
        except Exception:
            return False
        return bool(found.items)

    try:
        await wait_until(listed, f"ResourceSlices of node {node}", timeout=3600)
    finally:
        api_client.close()


def _template(profile: str) -> dict[str, Any]:
    selector = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    return {"metadata": {"name": f"mig-{profile.replace('.', '-')}"}, "spec": {"spec": {
        "devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": DRIVER, "selectors": [{"cel": {"expression": selector}}]}}]}}}}


def _pod(name: str, profile: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "cuda-sample",
                        "resources": {"claims": [{"name": "mig"}]}}],
        "resourceClaims": [{"name": "mig",
                            "resourceClaimTemplateName": f"mig-{profile.replace('.', '-')}"}]}}


class Demo:
    def __init__(self, stack: Stack, console: Console) -> None:
        self.stack = stack
        self.console = console
        self.api_client = config.new_client_from_config(config_file=str(stack.kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.resource = client.ResourceV1Api(self.api_client)
        self.driver = SimDriver(stack.layout.cluster.sim_state)
        self.failed: set[str] = set()

    def say(self, text: str) -> None:
        self.console.print(f"  {text}", markup=False, highlight=False, soft_wrap=True)

    async def call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(method, *args, **kwargs)

    async def pods(self) -> dict[str, Any]:
        listed = await self.call(self.core.list_namespaced_pod, NAMESPACE)
        for pod in listed.items:
            if pod.status.phase == "Failed":
                self.failed.add(pod.metadata.name)
        return {p.metadata.name: p for p in listed.items}

    async def placements(self) -> dict[str, str]:
        """Pod name -> allocated device, read from the ResourceClaims."""
        listed = await self.call(self.resource.list_namespaced_resource_claim, NAMESPACE)
        found = {}
        for claim in listed.items:
            owner = next((r.name for r in claim.metadata.owner_references or []), "")
            allocation = claim.status.allocation if claim.status else None
            if allocation:
                found[owner] = allocation.devices.results[0].device
        return found

    async def running(self) -> set[str]:
        return {n for n, p in (await self.pods()).items() if p.status.phase == "Running"}

    async def submit(self) -> tuple[set[str], str]:
        for profile in sorted({p for _, p in MIX}):
            await self.call(self.resource.create_namespaced_resource_claim_template, NAMESPACE,
                            _template(profile))
        for name, profile in MIX:
            await self.call(self.core.create_namespaced_pod, NAMESPACE, _pod(name, profile))
        self.say(f"submitted together: {', '.join(f'{n} ({p})' for n, p in MIX)}")

        async def settled() -> tuple[set[str], str] | None:
            pods = await self.pods()
            up = {n for n, p in pods.items() if p.status.phase == "Running"}
            waiting = [n for n, p in pods.items() if p.status.phase == "Pending"
                       and not p.spec.node_name and any(
                           c.reason == "Unschedulable" for c in p.status.conditions or [])]
            if len(up) == 2 and len(waiting) == 1:
                return up, waiting[0]
            return None

        up, waiting = await wait_until(settled, "two Pods running and one Pending as unschedulable")
        where = await self.placements()
        for name in sorted(up):
            self.say(f"{name} runs on {where.get(name)}")
        pod = (await self.pods())[waiting]
        reason = next(c.message for c in pod.status.conditions if c.reason == "Unschedulable")
        self.say(f"{waiting} waits Pending: {reason}")
        return up, waiting

    async def show_status(self) -> None:
        async def with_claims() -> dict[str, Any] | None:
            doc = await node_status.gather(self.stack.node, (self.stack.nats_url,),
                                           auth=self.stack.auth)
            named = any(c["resource_claim"] for card in doc["cards"] for c in card["claims"])
            return doc if named else None

        doc = await wait_until(with_claims, "partkeeper status showing the claims with their "
                               "ResourceClaims")
        for card in doc["cards"]:
            for claim in card["claims"]:
                self.say(f"status: card {card['index']} {claim['profile']} at "
                         f"{claim['start']}+{claim['size']} {claim['state']} for ResourceClaim "
                         f"{claim['resource_claim'] or '-'} (Pod {claim['name']})")

    async def card_fails(self) -> str:
        """A card with a running Pod reports XID FAILING_XID: the Pod's status shows its device
        Unhealthy with the card and XID, then Healthy after the reset."""
        where = await self.placements()
        up = sorted(await self.running())
        victim = next(n for n in up if n in where)
        card = int(where[victim].split("-")[1])  # gpu-<card>-mig-...
        await self.call(self.driver.fail_card, card, FAILING_XID)
        self.say(f"card {card} reports XID {FAILING_XID} "
                 f"(`partkeeper sim fail --card {card} --xid {FAILING_XID}`)")

        async def shown(word: str) -> list[dict[str, Any]] | None:
            entries = await resource_health(self.core, victim, NAMESPACE)
            return entries if health_words(entries) == {word} else None

        entries = await wait_until(lambda: shown("Unhealthy"),
                                   f"{victim}'s status showing its device Unhealthy")
        self.say(health_line(victim, entries))
        await self.call(self.driver.recover_card, card)
        entries = await wait_until(lambda: shown("Healthy"),
                                   f"{victim}'s status showing its device Healthy again")
        self.say(f"card {card} reset (`partkeeper sim recover`): {health_line(victim, entries)}")
        return f"card {card} failed (XID {FAILING_XID}): {victim} shown Unhealthy, then Healthy"

    async def free_room(self, up: set[str], waiting: str) -> float:
        # Each running Pod holds a card of its own (two 7g.80gb, or a 7g.80gb and the 1g.10gb
        # on the other card), so deleting either frees the room the waiting Pod needs.
        victim = sorted(up)[0]
        started = time.monotonic()
        await self.call(self.core.delete_namespaced_pod, victim, NAMESPACE)
        self.say(f"deleted {victim}; {waiting} is placed once its partition is destroyed")

        async def placed() -> bool:
            return waiting in await self.running()

        await wait_until(placed, f"{waiting} running after {victim} was deleted")
        took = time.monotonic() - started
        self.say(f"{waiting} runs on {(await self.placements()).get(waiting)} "
                 f"{took:.2f}s after {victim} was deleted")
        return took

    async def clean(self) -> None:
        for name in list(await self.pods()):
            await self.call(self.core.delete_namespaced_pod, name, NAMESPACE)
        partition_cards = [c for c in self.driver.cards() if c.mode == "partition"]
        cards = [c.index for c in partition_cards]
        every = len(devices.all_devices(partition_cards))

        async def empty() -> bool:
            instances = [i for c in cards for i in await self.call(self.driver.instances, c)]
            slices = await self.call(self.resource.list_resource_slice,
                                     field_selector=f"spec.nodeName={self.stack.node}")
            offered = sum(len(s.spec.devices or []) for s in slices.items)
            return not instances and not await self.pods() and offered == every

        await wait_until(empty, "every partition destroyed and every device offered again")
        self.say(f"all Pods deleted: no partition left, all {every} devices offered again")


SHARED = "shared"
SHARERS = ("share-a", "share-b")
CHOICES = ("3g.40gb", "1g.10gb")


def _shared_claim() -> dict[str, Any]:
    def choice(i: int, profile: str) -> dict[str, Any]:
        selector = f'device.attributes["{DRIVER}"].profile == "{profile}"'
        return {"name": f"p{i}", "deviceClassName": DRIVER,
                "selectors": [{"cel": {"expression": selector}}]}

    return {"metadata": {"name": SHARED}, "spec": {"devices": {"requests": [
        {"name": "gpu", "firstAvailable": [choice(i, p) for i, p in enumerate(CHOICES)]}]}}}


def _sharer(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "cuda-sample",
                        "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": SHARED}]}}


class SharedStep:
    """One prioritized-list ResourceClaim shared by two Pods (module docstring)."""

    def __init__(self, demo: Demo) -> None:
        self.demo = demo

    async def instances(self) -> list[str]:
        cards = [c.index for c in self.demo.driver.cards() if c.mode == "partition"]
        return [i.uuid for c in cards for i in await self.demo.call(self.demo.driver.instances, c)]

    async def run(self) -> str:
        demo = self.demo
        await demo.call(demo.resource.create_namespaced_resource_claim, NAMESPACE,
                        _shared_claim())
        for name in SHARERS:
            await demo.call(demo.core.create_namespaced_pod, NAMESPACE, _sharer(name))

        async def both() -> bool:
            return set(SHARERS) <= await demo.running()

        await wait_until(both, f"{' and '.join(SHARERS)} running on ResourceClaim {SHARED}")
        claim = await demo.call(demo.resource.read_namespaced_resource_claim, SHARED, NAMESPACE)
        (result,) = claim.status.allocation.devices.results
        partitions = await self.instances()
        if result.request != "gpu/p0" or len(partitions) != 1:
            raise DemoFailed(f"ResourceClaim {SHARED}: allocated {result.request} "
                             f"{result.device}, {len(partitions)} partition(s); wanted gpu/p0 on "
                             "one partition")
        demo.say(f"ResourceClaim {SHARED} (firstAvailable {' else '.join(CHOICES)}) got "
                 f"{result.request} = {result.device}; {' and '.join(SHARERS)} run on its one "
                 "partition")
        await demo.call(demo.core.delete_namespaced_pod, SHARERS[0], NAMESPACE)

        async def first_gone() -> bool:
            return SHARERS[0] not in await demo.pods()

        await wait_until(first_gone, f"{SHARERS[0]} gone")
        if await self.instances() != partitions or SHARERS[1] not in await demo.running():
            raise DemoFailed(f"the partition of ResourceClaim {SHARED} did not outlive "
                             f"{SHARERS[0]} while {SHARERS[1]} still uses it")
        demo.say(f"{SHARERS[0]} deleted: the partition stays, {SHARERS[1]} still runs on it")
        await demo.call(demo.core.delete_namespaced_pod, SHARERS[1], NAMESPACE)

        async def destroyed() -> bool:
            return not await self.instances() and not await demo.pods()

        await wait_until(destroyed, f"the partition destroyed after {SHARERS[1]}, the last Pod")
        demo.say(f"{SHARERS[1]} deleted: the claim was unprepared and deallocated, and its "
                 "partition destroyed")
        await demo.call(demo.resource.delete_namespaced_resource_claim, SHARED, NAMESPACE)
        return result.request


async def run(stack: Stack, console: Console) -> DraOutcome:
    outcome = DraOutcome()
    demo = Demo(stack, console)
    console.print("partkeeper demo (DRA mode)", markup=False, highlight=False)
    started = time.monotonic()
    try:
        up, waiting = await demo.submit()
        await demo.show_status()
        took = await demo.free_room(up, waiting)
        failed_card = await demo.card_fails()
        await demo.clean()
        chose = await SharedStep(demo).run()
        await demo.clean()
        if demo.failed:
            raise DemoFailed(f"Pods failed: {', '.join(sorted(demo.failed))}")
        outcome.passed = True
        outcome.lines = [
            "partkeeper demo summary (DRA mode)",
            f"  Pods submitted {len(MIX)}, placed at once 2, waited Pending 1, failed 0",
            f"  the waiting Pod ran {took:.2f}s after the Pod holding its room was deleted",
            f"  {failed_card}",
            f"  shared ResourceClaim: {len(SHARERS)} Pods on one partition, kept until the last "
            f"was gone; firstAvailable allocated {chose}",
            f"  {time.monotonic() - started:.1f}s in all; PASSED",
        ]
    except (DemoFailed, node_status.StatusError) as exc:
        outcome.error = str(exc)
        outcome.lines = ["partkeeper demo summary (DRA mode)", f"  FAILED: {exc}",
                         f"  logs in {stack.layout.logs_dir}"]
    finally:
        demo.api_client.close()
    return outcome
