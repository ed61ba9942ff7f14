"""Seeded model-based chaos over the real services: `python -m bench.chaos --steps N --seed S`.

A random but replayable sequence of what a node lives through, on one H100-80GB (whose 1g, 3g
and 7g profiles exclude each other): Pods created (unbound) and bound in an order unrelated to
their creation, Pods the kubelet rejects before device admission (OutOfcpu), containers that stop
while the kubelet's status reaches the API server late (a lag that varies), graceful deletes, the
allocator and the reclaimer stopped and started again, the kubelet restarting. After every step
it checks the invariants this project exists for (`check_safety`):

- no Pod runs on a partition whose claim names another Pod;
- no live Pod's instance is destroyed (a Pod the kubelet runs keeps the instance it was given);
- no token is advertised Healthy beyond what can be placed (within the 100 ms push window,
  granted some slack on a loaded machine);

and, every `--settle-every` steps and at the end, that instances converge to one per live Pod.
A failure prints the seed and step to replay. The model is the set of Pods the run created and
what it did to each; the node is `bench/chaos_node.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client

from bench.chaos_node import ChaosNode, chaos_node
from partkeeper.bus import ensure_topology
from partkeeper.kubelet import HEALTHY
from partkeeper_sim.driver import FaultOp
from partkeeper_sim.kubelet import PodState
from partkeeper_sim.stack.natsserver import NatsServer
from services.allocator.core import capacity, catalog
from tests_support import show_waiting_tasks

PROFILES = ("1g.10gb", "3g.40gb", "7g.80gb")
PREFIX = "nvidia.com/mig-"
HEALTH_GRACE = 2.0  # seconds a Healthy list may lag a change before it counts as a violation
SETTLE_SECONDS = 40.0
STEP_SECONDS = 60.0  # a step with its checks that takes longer is a hang: reported, run ends
LAGS = (0.0, 0.05, 0.3, 1.0)


@dataclass
class PodModel:
    name: str
    uid: str
    resource: str
    bound: bool = False
    deleted: bool = False
    rejected: bool = False


@dataclass
class Run:
    seed: int
    rng: random.Random
    node: ChaosNode
    pods: list[PodModel] = field(default_factory=list)
    steps: int = 0
    violations: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    ran: set[str] = field(default_factory=set)  # Pods seen running

    def violate(self, what: str) -> None:
        self.violations.append(f"seed {self.seed} step {self.steps}: {what}")


# -- steps -----------------------------------------------------------------------------------


async def create(run: Run) -> None:
    resource = PREFIX + run.rng.choice(PROFILES)
    name = f"p{len(run.pods)}-{uuid.uuid4().hex[:4]}"
    run.pods.append(PodModel(name, await run.node.create(name, resource), resource))


async def bind(run: Run) -> None:
    unbound = [p for p in run.pods if not p.bound and not p.deleted]
    if not unbound:
        return await create(run)
    pod = run.rng.choice(unbound)  # any of them: binding order is not creation order
    await run.node.bind(pod.name)
    pod.bound = True


async def reject(run: Run) -> None:
    """A Pod the node cannot fit: rejected before any Allocate, its status lagging too."""
    resource = PREFIX + run.rng.choice(PROFILES)
    name = f"big{len(run.pods)}-{uuid.uuid4().hex[:4]}"
    pod = PodModel(name, await run.node.create(name, resource, cpu="64"), resource,
                   rejected=True)
    run.pods.append(pod)
    await run.node.bind(name)
    pod.bound = True


async def stop_containers(run: Run) -> None:
    running = [p for p in run.pods if _state(run, p) is PodState.RUNNING]
    if running:
        await run.node.kubelet.finish(run.rng.choice(running).uid)


async def lag(run: Run) -> None:
    run.node.kubelet.status_lag = run.rng.choice(LAGS)


async def delete(run: Run) -> None:
    alive = [p for p in run.pods if not p.deleted]
    if alive:
        pod = run.rng.choice(alive)
        pod.deleted = True
        await run.node.delete(pod.name)


async def restart(run: Run, name: str) -> None:
    service = run.node.services[name]
    await service.stop()
    await service.start()


async def restart_kubelet(run: Run) -> None:
    await run.node.kubelet.restart()


async def stop_halfway(run: Run) -> None:
    """The driver's next create or destroy stops between its two steps and fails (the sim's
    `halfway` fault): a GPU instance is left without compute instance for the retry to finish."""
    ops: tuple[FaultOp, ...] = ("create", "destroy")
    await asyncio.to_thread(run.node.driver.fail, run.rng.choice(ops), 1, "halfway")


async def time_passes(run: Run) -> None:
    """The model's clock: the kubelet admits, statuses arrive, the reclaimer catches up."""
    await asyncio.sleep(run.rng.choice((0.02, 0.1, 0.4, 1.0)))


STEPS: tuple[tuple[str, int, Callable[[Run], Awaitable[None]]], ...] = (
    ("create", 6, create),
    ("bind", 6, bind),
    ("reject", 1, reject),
    ("stop containers", 3, stop_containers),
    ("status lag", 2, lag),
    ("delete", 3, delete),
    ("restart allocator", 1, lambda run: restart(run, "allocator")),
    ("restart reclaimer", 1, lambda run: restart(run, "reclaimer")),
    ("restart kubelet", 1, restart_kubelet),
    ("time passes", 8, time_passes),
)
# With --driver-faults (off by default, so that a seed replays the sequence it always did).
DRIVER_FAULT_STEPS: tuple[tuple[str, int, Callable[[Run], Awaitable[None]]], ...] = (
    ("driver stops halfway", 2, stop_halfway),
)


def _refused(run: Run, pod: PodModel) -> bool:
    record = run.node.kubelet.record(pod.uid)
    return record is not None and record.state is PodState.REJECTED


def _state(run: Run, pod: PodModel) -> PodState | None:
    record = run.node.kubelet.record(pod.uid)
    return record.state if record is not None else None


# -- checks ----------------------------------------------------------------------------------


def _running(run: Run) -> dict[str, set[str]]:
    """Pod UID -> the partition UUIDs its containers were given, for Pods the kubelet runs."""
    given: dict[str, set[str]] = {}
    for pod in run.pods:
        record = run.node.kubelet.record(pod.uid)
        if record is None or record.state is not PodState.RUNNING:
            continue
        uuids = {u for c in record.containers.values() for r in c.responses.values()
                 for u in r.envs.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u}
        given[pod.uid] = uuids
    return given


async def check_safety(run: Run) -> None:
    before = _running(run)
    run.ran.update(before)
    claims = await run.node.claims()
    instances = {i.uuid for i in await run.node.instances()}
    after = _running(run)
    owners: dict[str, set[str]] = {}
    for claim in claims:
        if claim.instance is not None and claim.state == "active":
            owners.setdefault(claim.instance.uuid, set()).add(claim.pod_uid)
    for uid, uuids in before.items():
        if after.get(uid) != uuids:
            continue  # it stopped while we read: nothing can be concluded about it
        for uuid_ in uuids:
            if uuid_ not in instances:
                run.violate(f"Pod {uid} runs on {uuid_}, which was destroyed")
            elif owners.get(uuid_, set()) - {uid} or uid not in owners.get(uuid_, set()):
                run.violate(f"Pod {uid} runs on {uuid_}, whose claim names "
                            f"{sorted(owners.get(uuid_, set()))}")


async def check_health(run: Run) -> None:
    """Healthy tokens no claim carries never exceed what can be placed (after the grace)."""
    deadline = time.monotonic() + HEALTH_GRACE
    while True:
        excess = await _excess(run)
        if not excess or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    for resource, (healthy, placeable) in excess.items():
        run.violate(f"{healthy} Healthy unclaimed {resource} tokens, {placeable} placeable")


async def _excess(run: Run) -> dict[str, tuple[int, int]]:
    claims = await run.node.claims()
    instances = await run.node.instances()
    cards = [run.node.driver.cards()[0]]
    offers = catalog.offers(cards, prefix=PREFIX, sliced_resource="nvidia.com/gpu.sliced",
                            slices_per_card=4)
    found: dict[str, tuple[int, int]] = {}
    for resource, offer in offers.items():
        carried = {t for c in claims if c.resource == resource for t in c.device_ids}
        healthy = sum(1 for t, h in run.node.kubelet.devices(resource).items()
                      if h == HEALTHY and t not in carried)
        placeable = sum(capacity.free_per_card(offer, claims, instances).values())
        if healthy > placeable:
            found[resource] = (healthy, placeable)
    return found


async def settle(run: Run, *, everything: bool) -> None:
    """Converge: instances are exactly those of the Pods the kubelet runs, one per claim."""
    if everything:
        for pod in run.pods:
            if not pod.deleted:
                pod.deleted = True
                await run.node.delete(pod.name)
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        problem = await _unsettled(run)
        if problem is None:
            return
        if time.monotonic() > deadline:
            run.violate(f"did not converge within {SETTLE_SECONDS:.0f}s: {problem}")
            _show_stuck()
            return
        await asyncio.sleep(0.1)


def _show_stuck() -> None:
    """Where the node's work waits (stderr), to tell a stuck admission's cause."""
    show_waiting_tasks(("allocat", "realise", "sim-kubelet", "dial", "chaos"))


async def _unsettled(run: Run) -> str | None:
    admitting = [p.name for p in run.pods if _state(run, p) is PodState.ADMITTING]
    if admitting:
        error = run.node.kubelet.sync_error
        return f"still admitting {admitting}" + (f" (kubelet: {error!r})" if error else "")
    given = _running(run)
    wanted = {u for uuids in given.values() for u in uuids}
    have = {i.uuid for i in await run.node.instances()}
    if have != wanted:
        return f"instances {sorted(have)} but the running Pods hold {sorted(wanted)}"
    claims = await run.node.claims()
    stray = [c.id for c in claims if c.pod_uid not in given]
    if stray:
        return f"claims {stray} of Pods that do not run"
    return None


# -- the run ---------------------------------------------------------------------------------


async def run_chaos(nc: Client, *, steps: int, seed: int, settle_every: int = 25,
                    progress: Callable[[str], None] | None = None,
                    driver_faults: bool = False) -> Run:
    rng = random.Random(seed)
    node = f"chaos-{seed}-{uuid.uuid4().hex[:6]}"
    menu = STEPS + (DRIVER_FAULT_STEPS if driver_faults else ())
    weights = [w for _, w, _ in menu]
    async with chaos_node(nc, node) as chaos:
        run = Run(seed, rng, chaos)
        for _ in range(steps):
            run.steps += 1
            name, _, step = rng.choices(menu, weights)[0]
            run.kinds[name] = run.kinds.get(name, 0) + 1
            if progress is not None:
                progress(f"step {run.steps}: {name}")
            # A task of its own, so that a step that hangs is shown where it waits before it is
            # cancelled.
            checked = asyncio.create_task(_step_and_check(run, step, settle_every),
                                          name=f"chaos step {run.steps}: {name}")
            done, _ = await asyncio.wait({checked}, timeout=STEP_SECONDS + SETTLE_SECONDS)
            if done:
                checked.result()
            else:
                run.violate(f"{name} and its checks did not finish within "
                            f"{STEP_SECONDS + SETTLE_SECONDS:.0f}s (stuck work on stderr)")
                _show_stuck()
                checked.cancel()
                await asyncio.gather(checked, return_exceptions=True)
            if run.violations:
                break
        if not run.violations:
            await settle(run, everything=True)
        return run


async def _step_and_check(run: Run, step: Callable[[Run], Awaitable[None]],
                          settle_every: int) -> None:
    await step(run)
    run.node.check_services()
    await check_safety(run)
    await check_health(run)
    if run.steps % settle_every == 0:
        await settle(run, everything=False)


async def _main(steps: int, seed: int, settle_every: int, verbose: bool,
                driver_faults: bool) -> int:
    server = NatsServer().start()
    try:
        nc = await nats.connect(server.url)
        await ensure_topology(nc.jetstream())
        started = time.monotonic()
        show = (lambda line: print(line, file=sys.stderr, flush=True)) if verbose else None
        run = await run_chaos(nc, steps=steps, seed=seed, settle_every=settle_every,
                              progress=show, driver_faults=driver_faults)
        took = time.monotonic() - started
        await nc.drain()
    finally:
        server.stop()
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(run.kinds.items()))
    reasons: dict[str, int] = {}
    for pod in run.pods:
        if _refused(run, pod):
            record = run.node.kubelet.record(pod.uid)
            assert record is not None  # a refused Pod has its record
            reasons[record.reason] = reasons.get(record.reason, 0) + 1
    refused = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())) or "none"
    print(f"seed {seed}: {run.steps} steps in {took:.1f}s ({kinds}); {len(run.pods)} Pods, "
          f"{len(run.ran)} ran; refused at admission: {refused}; "
          f"violations: {len(run.violations)}")
    for violation in run.violations:
        print(f"  {violation}\n  replay: python -m bench.chaos --steps {run.steps} --seed {seed}")
    return 1 if run.violations else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settle-every", type=int, default=25)
    parser.add_argument("--verbose", action="store_true", help="print each step as it starts")
    parser.add_argument("--driver-faults", action="store_true",
                        help="also make the driver stop creates and destroys halfway")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    return asyncio.run(_main(args.steps, args.seed, args.settle_every, args.verbose,
                             args.driver_faults))


if __name__ == "__main__":
    sys.exit(main())
