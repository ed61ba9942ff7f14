"""One reclaim cycle on a running stack: delete a Pod, stamp what follows, place a replacement.

Every stamp is time.monotonic() in this process. T0 is taken just before the delete request is
sent, so the request's own round trip counts against partkeeper, never for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from bench.reclaim_watch import HardwareWatch, HealthStream, Update, latency_ms
from partkeeper_sim.stack.kube import Kube, PodWatch
from partkeeper_sim.stack.launch import Stack
from partkeeper_sim.stack.observe import DemoError, Observer, PodTrack
from partkeeper_sim.stack.probe import Probe
from partkeeper_sim.stack.scheduling import Scheduler
from services.allocator.deviceplugin.registration import endpoint_name

ADMIT_SECONDS = 30.0  # a replacement from creation to Running; also its claim to be active
# Allocator pushes are due within 100 ms of a change (docs/contract.md section 5): this long
# after the destroy without a withdrawal, none is coming.
SETTLE_SECONDS = 1.0
NEVER_WITHDRAWN = ("the token was never withdrawn on ListAndWatch: the reclaim finished before "
                   "the allocator's next recompute, so there is no re-advertisement to time")


class BenchError(Exception):
    """The run cannot go on (a Pod not admitted, the node not settling between cycles)."""


@dataclass(frozen=True, slots=True)
class Options:
    cycles: int
    profile: str
    deadline: float  # seconds after T0 by which T1 and T2 must each be seen
    poll: float  # seconds between reads of the simulated cards
    keep: bool = False  # keep the working directory (logs) even when the run went through


@dataclass(slots=True)
class Cycle:
    """One delete; a stamp left None never came (a miss, listed in `problems`)."""

    index: int
    deleted: float = 0.0  # T0
    delete_returned: float | None = None
    destroyed: float | None = None  # T1
    withdrawn: float | None = None  # Tw
    advertised: float | None = None  # T2
    admitted: float | None = None  # the replacement, created -> Running, in seconds
    never_withdrawn: bool = False
    problems: list[str] = field(default_factory=list)
    trace: list[Update] = field(default_factory=list)  # kept when the cycle is odd

    def since_delete(self, at: float | None) -> float | None:
        return None if at is None else at - self.deleted

    @property
    def odd(self) -> bool:
        return bool(self.problems) or self.never_withdrawn


@dataclass(slots=True)
class Rig:
    """Everything a cycle touches, on a running stack."""

    options: Options
    resource: str
    kube: Kube
    observer: Observer
    scheduler: Scheduler
    probe: Probe
    health: HealthStream
    hardware: HardwareWatch


@contextlib.asynccontextmanager
async def rig(stack: Stack, options: Options) -> AsyncIterator[Rig]:
    paths = stack.layout.cluster
    configured = latency_ms(paths.sim_state)
    if any(configured.values()):
        raise BenchError(f"the simulated driver has latencies set ({configured}); want none")
    resource = stack.config.resource_prefix + options.profile
    kube = Kube(stack.kubeconfig, stack.node)
    observer = Observer(stack.nc, stack.node)
    touch = observer.wakeups.touch  # both observers wake the waits that re-check them
    health = HealthStream(paths.device_plugin_dir / endpoint_name(resource), touch)
    hardware = HardwareWatch(paths.sim_state, options.poll, touch)
    watch = PodWatch(kube, observer.on_pod)
    scheduler = Scheduler(kube, observer, stack.nc, paths.pod_resources_socket)
    await observer.start()
    try:
        watch.start()
        hardware.start()
        await health.start()
        yield Rig(options, resource, kube, observer, scheduler, Probe(stack), health, hardware)
    finally:
        await health.stop()
        hardware.stop()
        await watch.stop()
        await observer.stop()
        kube.close()


async def until(r: Rig, check: Callable[[], Awaitable[bool]], what: str) -> None:
    try:
        await r.observer.wakeups.until(check, timeout=ADMIT_SECONDS, what=what,
                                       hint="see logs/allocator.log and logs/cluster.log")
    except DemoError as exc:
        raise BenchError(str(exc)) from exc


async def place(r: Rig, index: int) -> PodTrack:
    """A Pod of the profile: created, bound once there is room, Running, its claim active."""
    name = f"bench-{r.options.profile.split('.')[0]}-{index}"
    try:
        async with asyncio.timeout(ADMIT_SECONDS):
            pod = await r.scheduler.create(name, r.resource, "partition")
            await r.scheduler.schedule(pod)
    except (TimeoutError, DemoError) as exc:
        raise BenchError(f"Pod {name} not Running within {ADMIT_SECONDS:.0f}s ({exc}); "
                         "see logs/allocator.log and logs/cluster.log") from exc
    if pod.refused:
        raise BenchError(f"Pod {pod.name} was refused: {pod.refused}")

    async def active() -> bool:
        claims = [c for c in await r.probe.claims() if c.pod_uid == pod.uid]
        if len(claims) != 1 or claims[0].state != "active" or claims[0].instance is None:
            return False
        pod.instance = claims[0].instance.uuid
        return True

    await until(r, active, f"an active claim with an instance for Pod {pod.name}")
    return pod


async def ready(r: Rig, pod: PodTrack) -> None:
    """Before T0: every token Healthy on ListAndWatch and the instance seen on the cards."""

    async def settled() -> bool:
        latest = r.health.updates[-1] if r.health.updates else None
        return latest is not None and latest.whole and pod.instance in r.hardware.uuids()

    await until(r, settled, f"a settled node with Pod {pod.name} running")


async def reclaim(r: Rig, pod: PodTrack, cycle: Cycle) -> None:
    """Delete the Pod (T0); stamp the destroy (T1), the withdrawal (Tw), the re-advertisement
    (T2)."""
    gone = r.hardware.gone(pod.instance)
    mark = len(r.health.updates)
    cycle.deleted = time.monotonic()
    try:
        async with asyncio.timeout(r.options.deadline):
            await r.kube.delete(pod.name)
    except TimeoutError as exc:
        raise BenchError(f"the API server did not answer the delete of Pod {pod.name} within "
                         f"{r.options.deadline:g}s; see logs/cluster.log") from exc
    cycle.delete_returned = time.monotonic()
    deadline = cycle.deleted + r.options.deadline
    with contextlib.suppress(TimeoutError):
        cycle.destroyed = await asyncio.wait_for(gone, max(0.0, deadline - time.monotonic()))
    if cycle.destroyed is None:
        problem = r.hardware.error or "the instance still on the cards"
        cycle.problems.append(f"destroy not seen within {r.options.deadline:g}s ({problem})")
    await readvertised(r.health, mark, cycle, deadline)
    if cycle.odd:
        cycle.trace = r.health.updates[mark:]


async def readvertised(stream: HealthStream, mark: int, cycle: Cycle, deadline: float) -> None:
    """Stamp Tw and T2 from the responses that arrived since `mark` (the first after T0)."""
    while True:
        since = stream.updates[mark:]
        out = next((i for i, u in enumerate(since) if not u.whole), None)
        if out is not None:
            cycle.withdrawn = since[out].at
            back = next((u for u in since[out + 1:] if u.whole), None)
            if back is not None:
                cycle.advertised = back.at
                return
        elif cycle.destroyed is not None and time.monotonic() >= cycle.destroyed + SETTLE_SECONDS:
            cycle.never_withdrawn = True
            return
        if stream.ended:
            cycle.problems.append(f"ListAndWatch ended ({stream.ended})")
            return
        wait = deadline
        if out is None and cycle.destroyed is not None:
            wait = min(deadline, cycle.destroyed + SETTLE_SECONDS)
        if not await stream.next_update(wait) and time.monotonic() >= deadline:
            state = "withdrawn, not back" if out is not None else "never withdrawn"
            cycle.problems.append(f"capacity not re-advertised within "
                                  f"{deadline - cycle.deleted:g}s ({state})")
            return


async def run_cycles(r: Rig, cycles: list[Cycle]) -> None:
    """The first Pod, then `options.cycles` deletes, each followed by its replacement."""
    pod = await place(r, 0)
    for index in range(1, r.options.cycles + 1):
        await ready(r, pod)
        cycle = Cycle(index)
        cycles.append(cycle)
        await reclaim(r, pod, cycle)
        pod = await place(r, index)
        cycle.admitted = (pod.running or pod.created) - pod.created


def odd_cycles(cycles: list[Cycle], limit: int = 5) -> list[str]:
    """The first odd cycles, with wall-clock times to find them in the services' logs (`ts`)."""
    offset = time.time() - time.monotonic()
    out: list[str] = []
    for cycle in [c for c in cycles if c.odd][:limit]:

        def rel(t: float | None, c: Cycle = cycle) -> str:
            return "-" if t is None else f"+{(t - c.deleted) * 1000:.1f}ms"

        stream = ", ".join(f"{rel(u.at)} {u.healthy}/{u.total} Healthy" for u in cycle.trace)
        why = cycle.problems + ([NEVER_WITHDRAWN] if cycle.never_withdrawn else [])
        out.append(f"cycle {cycle.index}: deleted at ts {cycle.deleted + offset:.3f}, destroyed "
                   f"{rel(cycle.destroyed)}, ListAndWatch since: {stream or 'nothing'}; "
                   + "; ".join(why))
    return out
