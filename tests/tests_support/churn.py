"""Pods coming and going on the embedded stack, and a sentinel for the one unforgivable outcome.

`Workload` creates Pods through the real Kubernetes client the way the demo does (unbound, then
bound once kubelet and allocator show room: demo `Scheduler`) and remembers each one (`PodTrack`).
`Churn` keeps a few Pods cycling through create -> Running -> delete until stopped. `Sentinel`
watches, on every change pushed by NATS and a few times a second, for a partition destroyed
under a live Pod: an active claim of a Pod that runs and that nobody deleted, whose instance is
gone from the cards, or whose claim went `releasing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count

from kubernetes.client.exceptions import ApiException

from partkeeper_sim.stack.kube import Kube, PodWatch
from partkeeper_sim.stack.launch import Stack
from partkeeper_sim.stack.observe import (
    DemoError,
    Observer,
    PodTrack,
    honour_cancel,
    woken_or_timeout,
)
from partkeeper_sim.stack.probe import Probe
from partkeeper_sim.stack.scheduling import Scheduler

SENTINEL_SECONDS = 0.25
NOT_FOUND = 404


@dataclass(slots=True)
class Tally:
    created: int = 0
    admitted: int = 0
    refused: int = 0
    unscheduled: int = 0  # no room came within the scheduler's deadline
    deleted: int = 0
    refusals: list[str] = field(default_factory=list)


class Workload:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.kube = Kube(stack.kubeconfig, stack.node)
        self.observer = Observer(stack.nc, stack.node)
        self.scheduler = Scheduler(self.kube, self.observer, stack.nc,
                                   stack.layout.cluster.pod_resources_socket)
        self.probe = Probe(stack)
        self.tally = Tally()
        self._watch = PodWatch(self.kube, self.observer.on_pod)
        self._serial = count(1)

    async def start(self) -> None:
        await self.observer.start()
        self._watch.start()

    async def stop(self) -> None:
        await self._watch.stop()
        await self.observer.stop()
        self.kube.close()

    def resource(self, profile: str | None) -> str:
        """A profile's resource name (None: the logical-slice resource)."""
        config = self.stack.config
        return config.sliced_resource if profile is None else config.resource_prefix + profile

    def pods(self) -> list[PodTrack]:
        return list(self.observer.pods.values())

    def live(self) -> list[PodTrack]:
        return [p for p in self.pods() if p.running and p.deleted is None]

    async def admit(self, profile: str | None, prefix: str = "pod") -> PodTrack:
        """Create a Pod asking one device of `profile`, bind it once there is room, and return it
        settled (Running, or refused: `refused` says why). DemoError when no room comes."""
        resource = self.resource(profile)
        kind = "slice" if profile is None else "partition"
        name = f"{prefix}-{next(self._serial)}"
        self.tally.created += 1
        pod = await self.scheduler.create(name, resource, kind)
        try:
            await self.scheduler.schedule(pod)
        except DemoError:
            self.tally.unscheduled += 1
            raise
        if pod.refused:
            self.tally.refused += 1
            self.tally.refusals.append(f"{pod.name}: {pod.refused}")
        else:
            self.tally.admitted += 1
        return pod

    async def delete(self, pod: PodTrack) -> None:
        if pod.deleted is None:
            self.tally.deleted += 1
            try:
                await self.scheduler.delete(pod)
            except ApiException as exc:
                # A create cancelled before its call was made leaves nothing to delete.
                if exc.status != NOT_FOUND:
                    raise

    async def delete_all(self, prefix: str = "") -> None:
        """Delete every Pod this workload made (whose name starts with `prefix`)."""
        await asyncio.gather(*(self.delete(p) for p in self.pods()
                               if p.name.startswith(prefix) and p.deleted is None))


class Churn:
    """`slots` Pods at a time, each created, run for a random while, deleted, again."""

    def __init__(self, workload: Workload, profiles: Sequence[str | None], *, slots: int = 3,
                 lifetime: tuple[float, float] = (0.1, 1.5), seed: int = 0,
                 prefix: str = "churn") -> None:
        self.workload = workload
        self.profiles = list(profiles)
        self.slots = slots
        self.lifetime = lifetime
        self.rng = random.Random(seed)
        self.prefix = prefix
        self.cycles = 0
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._slot(), name=f"churn slot {i}")
                       for i in range(self.slots)]

    async def stop(self) -> None:
        """Stop cycling; the Pods of this churn are then all deleted."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.workload.delete_all(self.prefix)

    async def until_cycles(self, cycles: int, timeout: float) -> None:
        """Wait (bounded) until this many Pods went through a whole cycle."""
        end = time.monotonic() + timeout
        with self.workload.observer.wakeups.listen() as woken:
            while self.cycles < cycles:
                self._raise_if_a_slot_failed()
                if time.monotonic() > end:
                    raise DemoError(f"churn made {self.cycles} of {cycles} cycles in "
                                    f"{timeout:.0f}s")
                woken.clear()
                await woken_or_timeout(woken, 1.0)

    def _raise_if_a_slot_failed(self) -> None:
        """A slot that ended with an error stops cycling: say so instead of stalling."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise DemoError(f"churn {task.get_name()} failed: "
                                f"{task.exception()!r}") from task.exception()

    async def _slot(self) -> None:
        while True:
            honour_cancel()
            profile = self.rng.choice(self.profiles)
            with contextlib.suppress(DemoError):  # no room in time: counted, try another
                pod = await self.workload.admit(profile, self.prefix)
                if not pod.refused:
                    await asyncio.sleep(self.rng.uniform(*self.lifetime))  # the Pod's run
                await self.workload.delete(pod)
                self.cycles += 1


class Sentinel:
    """Records every partition destroyed (or claim released) under a live Pod."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.violations: dict[str, str] = {}  # claim id -> what happened
        self.checks = 0
        self.errors = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sentinel")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        with self.workload.observer.wakeups.listen() as woken:
            while True:
                honour_cancel()
                woken.clear()
                try:
                    await self.check()
                except Exception:  # NATS down, a read failed: nothing is concluded from it
                    self.errors += 1
                await woken_or_timeout(woken, SENTINEL_SECONDS)

    async def check(self) -> None:
        by_uid = {p.uid: p for p in self.workload.pods() if p.uid}
        claims = await self.workload.probe.claims()
        instances = await self.workload.probe.instances()
        # Read after the cards: a Pod deleted before this point may rightly have lost its
        # partition already, one still undeleted now was live through both reads.
        live = {uid for uid, p in by_uid.items() if p.running and p.deleted is None}
        self.checks += 1
        for claim in claims:
            if claim.pod_uid not in live or claim.id in self.violations:
                continue
            pod = by_uid[claim.pod_uid]
            if claim.state == "releasing":
                self.violations[claim.id] = f"claim {claim.id} of live Pod {pod.name} released"
            elif claim.state == "active" and claim.instance is not None \
                    and claim.instance.uuid not in instances:
                self.violations[claim.id] = (f"partition {claim.instance.uuid} of live Pod "
                                             f"{pod.name} destroyed (claim {claim.id})")
