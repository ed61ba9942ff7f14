"""`partkeeper up --demo --migrate`: a node moves from device plugins to DRA with its Pods running
(docs/operations.md, "Moving a node to DRA").

The simulated node runs kubelet's device-plugin and DRA sides together (`sim cluster --mode
both`) and the allocator in device-plugin mode. Pods of several profiles asking for
`nvidia.com/mig-<profile>` in their limits are admitted through the device plugin. Then only the
allocator is restarted with `PK_MODE=dra`: its device plugins go, kubelet reports their
resources at 0, and the scheduler serves those names through the DeviceClasses with
`extendedResourceName` (KEP-5004). New Pods with the same, unchanged specs are admitted through
DRA while the old ones run; the old ones are deleted, and their room, once destroyed and
published again, is filled through DRA by Pods with the same specs again.

What is measured, and what the summary holds to:
- Pods restarted: an old Pod that left Running, changed its UID or start time, or whose devices
  in kubelet's pod-resources (its checkpoint of device-plugin assignments) changed, before it
  was deleted;
- partitions destroyed under live Pods: an old Pod's partition missing from the hardware while
  the Pod lives, looked at after every step;
- overlapping allocations: a device the scheduler allocated, or one the node offers, whose
  memory slices overlap an adopted partition;
- over-admissions: any Pod that failed (a Pod that cannot be placed stays Pending);
- the time from each old Pod's deletion until a device at its partition's placement is offered
  again in the node's ResourceSlices.
`run` returns them; the demo passes only when the first four are 0 and every room came back.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException
from rich.console import Console

from partkeeper import status as node_status
from partkeeper.drivers.profiles import model, overlaps
from partkeeper.kubelet import open_unix_channel, podresources_pb2, podresources_pb2_grpc
from partkeeper_sim.stack.dra_demo import NAMESPACE, Demo, DemoFailed, wait_until
from partkeeper_sim.stack.launch import Stack, service_ready, start_service
from partkeeper_sim.stack.processes import Supervisor

PROFILES = ("3g.40gb", "2g.20gb", "1g.10gb")
PREFIX = "nvidia.com/mig-"
STEP_SECONDS = 60.0


@dataclass(frozen=True)
class Placement:
    card: int
    start: int
    size: int
    profile: str

    def __str__(self) -> str:
        return f"{self.profile} on card {self.card} at {self.start}+{self.size}"

    def overlaps(self, other: Placement) -> bool:
        return self.card == other.card and overlaps((self.start, self.size),
                                                    (other.start, other.size))


@dataclass
class Old:
    """An old (device-plugin) Pod as first seen running."""

    name: str
    uid: str
    started: str
    devices: dict[str, list[str]]
    partition: str  # the MIG uuid
    placement: Placement
    deleted_at: float = 0.0
    room_back: float | None = None


@dataclass
class Outcome:
    passed: bool = False
    lines: list[str] = field(default_factory=list)
    restarted: set[str] = field(default_factory=set)
    destroyed_live: set[str] = field(default_factory=set)
    overlaps: list[str] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    room_back: dict[str, float] = field(default_factory=dict)
    adopted: int = 0
    admitted_through_dra: int = 0


def pod_body(name: str, profile: str, node: str | None = None) -> dict[str, Any]:
    """The one spec every Pod here uses, device-plugin style: only `node` differs (the old Pods
    were placed before the scheduler served these names)."""
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "cuda-sample",
        "resources": {"limits": {f"{PREFIX}{profile}": "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def device_placement(name: str, models: dict[int, str]) -> Placement:
    """`gpu-<card>-mig-<profile without the dot>-<start>` as a placement."""
    _, card, _, bare, start = name.split("-")
    table = model(models[int(card)]).profiles
    profile = next(p for p in table if p.replace(".", "") == bare)
    return Placement(int(card), int(start), table[profile].size, profile)


async def switch(stack: Stack, supervisor: Supervisor, mode: str,
                 services: Sequence[str] = ("allocator",)) -> None:
    """Restart `services` (the allocator at least) with `PK_MODE=mode`, as a DaemonSet rolled to
    the other variant would; the others keep running."""
    for name in services:
        child = [c for c in supervisor.children if c.name == name][-1]
        await supervisor.kill(child, signal.SIGTERM)
        env = {**stack.envs[name], "PK_MODE": mode}
        await start_service(stack.layout, supervisor, name, env)
    for name in services:
        await supervisor.guard(service_ready(stack.nc, name), timeout=STEP_SECONDS,
                               what=f"{name} answering in {mode} mode",
                               log=stack.layout.log(name))


class Migration(Demo):
    """The DRA demo's kit (clients, `say`, `pods`, which records failed Pods) and the steps."""

    def __init__(self, stack: Stack, supervisor: Supervisor, console: Console,
                 restarted: Sequence[str] = ("allocator",)) -> None:
        super().__init__(stack, console)
        self.supervisor = supervisor
        self.restarted = tuple(restarted)
        self.models = {c.index: c.model for c in self.driver.cards() if c.mode == "partition"}
        self.out = Outcome(failed=self.failed)
        self.old: dict[str, Old] = {}

    # -- what is read --------------------------------------------------------------------------

    async def partitions(self) -> dict[str, Placement]:
        found = {}
        for card in self.models:
            for inst in await self.call(self.driver.instances, card):
                found[inst.uuid] = Placement(card, inst.start, inst.size, inst.profile)
        return found

    async def kubelet_devices(self) -> dict[str, dict[str, list[str]]]:
        """Pod name -> container -> device IDs, as kubelet's pod-resources lists them."""
        async with open_unix_channel(self.stack.layout.cluster.pod_resources_socket) as channel:
            stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
            reply = await stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=5.0)
        return {p.name: {c.name: sorted(i for d in c.devices for i in d.device_ids)
                         for c in p.containers}
                for p in reply.pod_resources if p.namespace == NAMESPACE}

    async def offered(self) -> list[Placement]:
        listed = await self.call(self.resource.list_resource_slice,
                                 field_selector=f"spec.nodeName={self.stack.node}")
        return [device_placement(d.name, self.models)
                for s in listed.items for d in (s.spec.devices or [])]

    async def allocated(self) -> dict[str, Placement]:
        """Pod name -> the placement its special ResourceClaim was allocated (the demo kit's
        `placements`, as placements)."""
        return {pod: device_placement(device, self.models)
                for pod, device in (await self.placements()).items()}

    async def status(self) -> dict[str, Any]:
        return await node_status.gather(self.stack.node, (self.stack.nats_url,),
                                        auth=self.stack.auth)

    async def allocatable(self) -> dict[str, str]:
        node = await self.call(self.core.read_node, self.stack.node)
        return {k: v for k, v in (node.status.allocatable or {}).items() if k.startswith(PREFIX)}

    # -- the invariants, looked at after every step ----------------------------------------------

    async def check(self) -> None:
        pods, hardware, devices = await self.pods(), await self.partitions(), \
            await self.kubelet_devices()
        for old in self.old.values():
            if old.deleted_at:
                continue
            pod = pods.get(old.name)
            if pod is None or pod.metadata.uid != old.uid or pod.status.phase != "Running" or \
                    str(pod.status.start_time) != old.started or \
                    devices.get(old.name) != old.devices:
                self.out.restarted.add(old.name)
            if old.partition not in hardware:
                self.out.destroyed_live.add(old.name)
        # An old partition seen destroyed is gone for good: a successor at its placement has
        # the same name-based MIG uuid, and is not it.
        held = [o.placement for o in self.old.values()
                if o.room_back is None and o.partition in hardware]
        for name, where in (await self.allocated()).items():
            for adopted in held:
                if where.overlaps(adopted):
                    self.out.overlaps.append(f"{name} allocated {where} over {adopted}")

    # -- the steps ---------------------------------------------------------------------------

    async def admit(self, names: list[str], node: str | None) -> None:
        """One Pod at a time, largest first, each running before the next: the scheduler takes
        the first device that fits, so Pods arriving together in another order (their
        creation times tie within a second, then go by name) can split a card's room so that
        the last no longer fits; it would wait Pending, which is right but not this demo."""
        for name, profile in zip(names, PROFILES, strict=True):
            await self.call(self.core.create_namespaced_pod, NAMESPACE,
                            pod_body(name, profile, node))

            async def running(name: str = name) -> bool:
                pods = await self.pods()
                if self.out.failed:
                    raise DemoFailed(f"Pods failed: {', '.join(sorted(self.out.failed))}")
                return name in pods and pods[name].status.phase == "Running"

            await wait_until(running, f"{name} running")

    async def start_old(self) -> None:
        names = [f"old-{p.replace('.', '')}" for p in PROFILES]
        await self.admit(names, self.stack.node)
        pods, devices = await self.pods(), await self.kubelet_devices()
        uids = {pods[n].metadata.uid for n in names}

        async def recorded() -> dict[str, Any] | None:
            """Instance by Pod UID, once the published capacity shows every old Pod's (it
            follows the claims by a recompute)."""
            doc = await self.status()
            found = {i["claim"]["pod_uid"]: (i["uuid"], c["index"], i) for c in doc["cards"]
                     for i in c["instances"] if i["claim"]}
            return found if uids <= set(found) else None

        by_uid = await wait_until(recorded, "the old Pods' partitions in partkeeper status")
        for name in names:
            pod = pods[name]
            uuid, card, inst = by_uid[pod.metadata.uid]
            self.old[name] = Old(name, pod.metadata.uid, str(pod.status.start_time),
                                 devices[name], uuid,
                                 Placement(card, inst["start"], inst["size"], inst["profile"]))
            self.say(f"{name} runs through the device plugin on card {card} at "
                     f"{inst['start']}+{inst['size']} ({uuid}), kubelet devices "
                     f"{','.join(devices[name]['main'])}")

    async def to_dra(self) -> None:
        started = time.monotonic()
        await switch(self.stack, self.supervisor, "dra", self.restarted)

        async def moved() -> bool:
            left = await self.allocatable()
            return bool(await self.offered()) and all(v == "0" for v in left.values())

        await wait_until(moved, "the slices published and kubelet reporting the device-plugin "
                     "resources at 0")
        self.say(f"{', '.join(self.restarted)} restarted with PK_MODE=dra; "
                 f"{time.monotonic() - started:.2f}s until the slices were published and kubelet "
                 "reported the old resources at 0")
        def adopted_in(doc: dict[str, Any]) -> list[dict[str, Any]]:
            return [c for card in doc["cards"] for c in card["claims"] if c.get("adopted")]

        async def in_dra_mode() -> dict[str, Any] | None:
            # The mode and the adoption come from two writes of the restarted allocator: wait
            # for both, not for the first status that names the mode.
            doc = await self.status()
            if doc.get("allocator_mode") != "dra" or len(adopted_in(doc)) < len(self.old):
                return None
            return doc

        doc = await wait_until(in_dra_mode, "partkeeper status from the allocator in DRA mode, "
                               "every old claim adopted")
        adopted = adopted_in(doc)
        self.out.adopted = len(adopted)
        for where in await self.offered():
            for old in (o.placement for o in self.old.values()):
                if where.overlaps(old):
                    self.out.overlaps.append(f"the node offers {where} over adopted {old}")
        self.say(f"status: {len(adopted)} claims adopted (mode device-plugin, allocator in DRA "
                 "mode); no offered device overlaps them")
        await self.check()

    async def through_dra(self, names: list[str], what: str) -> None:
        await self.admit(names, None)
        where = await self.allocated()
        self.out.admitted_through_dra += len(names)
        for name in names:
            self.say(f"{name} ({what}, unchanged spec) runs through DRA: {where.get(name)}")
        await self.check()

    async def delete_old(self) -> None:
        for old in self.old.values():
            await self.call(self.core.delete_namespaced_pod, old.name, NAMESPACE)
            old.deleted_at = time.monotonic()

        async def all_back() -> bool:
            offered, hardware = await self.offered(), await self.partitions()
            for old in self.old.values():
                if old.room_back is None and old.partition not in hardware and \
                        any(o == old.placement for o in offered):
                    old.room_back = time.monotonic() - old.deleted_at
            return all(o.room_back is not None for o in self.old.values())

        await wait_until(all_back, "the old partitions destroyed and their room offered again")
        for old in self.old.values():
            assert old.room_back is not None
            self.out.room_back[old.name] = old.room_back
            self.say(f"{old.name} deleted: its {old.placement.profile} on card "
                     f"{old.placement.card} destroyed and offered again after "
                     f"{old.room_back:.2f}s")

    async def clean(self) -> None:
        for name in await self.pods():
            with contextlib.suppress(ApiException):
                await self.call(self.core.delete_namespaced_pod, name, NAMESPACE)

        async def empty() -> bool:
            return not await self.pods() and not await self.partitions()

        await wait_until(empty, "every Pod gone and every partition destroyed")


def summary(out: Outcome) -> list[str]:
    room = ", ".join(f"{n} {s:.2f}s" for n, s in sorted(out.room_back.items())) or "none"
    return [
        "partkeeper demo summary (device plugin -> DRA, live)",
        f"  Pods restarted {len(out.restarted)}, partitions destroyed under live Pods "
        f"{len(out.destroyed_live)}, over-admissions {len(out.failed)}, overlapping "
        f"allocations {len(out.overlaps)}",
        f"  claims adopted {out.adopted}; Pods admitted through DRA with unchanged specs "
        f"{out.admitted_through_dra}",
        f"  room of the old partitions back after: {room}",
    ]


def holds(out: Outcome) -> bool:
    return not (out.restarted or out.destroyed_live or out.failed or out.overlaps) and \
        len(out.room_back) == len(PROFILES) and out.adopted == len(PROFILES)


async def run(stack: Stack, supervisor: Supervisor, console: Console,
              restarted: Sequence[str] = ("allocator",)) -> Outcome:
    """The scenario; `restarted`: the services restarted in the switch (the allocator alone, as
    the demo does, or all four)."""
    migration = Migration(stack, supervisor, console, restarted)
    out = migration.out
    console.print("partkeeper demo (moving a node from the device plugin to DRA)",
                  markup=False, highlight=False)
    started = time.monotonic()
    try:
        await migration.start_old()
        await migration.to_dra()
        await migration.through_dra([f"new-{p.replace('.', '')}" for p in PROFILES],
                                    "beside the old ones")
        await migration.delete_old()
        await migration.through_dra([f"refill-{p.replace('.', '')}" for p in PROFILES],
                                    "in the old room")
        await migration.clean()
        out.passed = holds(out)
        out.lines = [*summary(out), f"  {time.monotonic() - started:.1f}s in all; "
                     f"{'PASSED' if out.passed else 'FAILED'}"]
        for problem in sorted(out.restarted | out.destroyed_live) + out.overlaps:
            out.lines.append(f"  problem: {problem}")
    except (DemoFailed, node_status.StatusError) as exc:
        out.lines = [*summary(out), f"  FAILED: {exc}", f"  logs in {stack.layout.logs_dir}"]
    finally:
        migration.api_client.close()
    return out
