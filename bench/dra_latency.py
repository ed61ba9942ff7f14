"""DRA latency: `python -m bench.dra_latency [--cycles 50] [--quiet 10]`.

The embedded stack of `partkeeper up --mode dra` (NATS, the simulated cluster with its DRA
scheduler and kubelet, the four services, each its own process; sim driver at zero latency). Each
cycle creates one Pod whose claim template asks for a 7g.80gb, waits for it to run, deletes it
and waits until its device is offered again. Stamps, all on arrival of a pushed event:

- Ta, the claim allocated: the ResourceClaim watch shows `status.allocation` (the scheduler's
  write);
- Tr, the partition ready: the pk-claims KV watch shows the claim `active` (created, identity
  recorded; the CDI spec follows before the reply);
- T0, the Pod deleted (the delete request returns);
- Ts, the slices re-published: the ResourceSlice watch shows a slice of a newer pool generation
  offering the deleted Pod's device again (the device slice is written last, so the pool is
  complete then). In between, the watcher declares the Pod gone, the reclaimer destroys the
  partition and the allocator re-publishes.

Every wait has a deadline; a miss counts as infinitely slow. Each figure is printed beside its
floor, the bare round trips of its path measured at the end of the run on the stack's own
nats-server and in its DRA plugin socket directory (bench.floors), and the goals issue 27 states
(DRA prepare p99 < 20 ms; DRA Pod deleted -> slices re-published p99 < 100 ms).

Slice writes are counted from the same ResourceSlice watch (every ADDED, MODIFIED or DELETED of
the node's slices is one write): per Pod cycle, and with the pool generations each cycle moved
(a cycle is two changes: the device withdrawn, then offered again; goal: at most one generation
per change); and on a quiet node, while `--quiet` unrelated Pods without claims come and go
(bound to the node, so the watcher, and with it the publisher, sees every one; goal: 0 writes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config, watch

from bench import floors as floor
from bench.figures import Latency
from partkeeper.dra import DRIVER
from partkeeper_sim.stack.launch import Stack, launch
from partkeeper_sim.stack.layout import Layout
from partkeeper_sim.stack.processes import StackError, Supervisor
from schemas import CardClaims, decode
from schemas.names import BUCKET_CLAIMS, claims_prefix

NAME = "DRA latency"
NAMESPACE = "bench"
PROFILE = "7g.80gb"
DEADLINE = 20.0


T = TypeVar("T")


@dataclass
class Cycle:
    allocated: float | None = None
    ready: float | None = None
    deleted: float | None = None
    republished: float | None = None
    writes: int = 0  # slice writes from the Pod's creation to its device offered again
    generations: int = 0  # pool generations those writes moved through


@dataclass
class Quiet:
    pods: int = 0
    writes: int = 0


class Stamps:
    """Events from watch threads and the KV watch, stamped on arrival, woken by a condition."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.changed = asyncio.Event()
        self.allocated: dict[str, float] = {}  # claim name -> first seen allocated
        self.active: dict[str, float] = {}  # ResourceClaim namespace/name -> first seen active
        self.offered: list[tuple[float, int, set[str]]] = []  # (when, generation, devices)
        self.writes: list[tuple[float, int]] = []  # (when, generation) of every slice event
        self.stopping = threading.Event()

    def note(self, record: Any) -> None:
        self.loop.call_soon_threadsafe(self._note, time.perf_counter(), record)

    def _note(self, when: float, record: Any) -> None:
        kind, value = record
        if kind == "claim":
            self.allocated.setdefault(value, when)
        elif kind == "slice":
            self.offered.append((when, *value))
        elif kind == "write":
            self.writes.append((when, value))
        self.changed.set()

    async def until(self, check: Callable[[], T | None], what: str) -> T | None:
        deadline = time.perf_counter() + DEADLINE
        while (found := check()) is None:
            left = deadline - time.perf_counter()
            if left <= 0:
                print(f"{NAME}: missed: {what}", file=sys.stderr)
                return None
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return found


def _raw(method: Any, *args: Any) -> Any:
    """A list call without a declared return type, so the watch yields plain JSON objects."""
    def call(**kwargs: Any) -> Any:
        return method(*args, **kwargs)

    return call


def _watch_claims(api: client.ResourceV1Api, stamps: Stamps) -> None:
    w = watch.Watch()
    for event in w.stream(_raw(api.list_namespaced_resource_claim, NAMESPACE),
                          timeout_seconds=3600):
        claim = event["object"]
        if (claim.get("status") or {}).get("allocation"):
            stamps.note(("claim", claim["metadata"]["name"]))
        if stamps.stopping.is_set():
            return


def _watch_slices(api: client.ResourceV1Api, node: str, stamps: Stamps) -> None:
    w = watch.Watch()
    for event in w.stream(_raw(api.list_resource_slice), field_selector=f"spec.nodeName={node}",
                          timeout_seconds=3600):
        spec = event["object"].get("spec") or {}
        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
            stamps.note(("write", int((spec.get("pool") or {}).get("generation", 0))))
        if "devices" in spec:
            names = {d["name"] for d in spec["devices"]}
            stamps.note(("slice", (spec["pool"]["generation"], names)))
        if stamps.stopping.is_set():
            return


async def _follow_claims(stack: Stack, stamps: Stamps) -> None:
    kv = await stack.nc.jetstream().key_value(BUCKET_CLAIMS)
    watcher = await kv.watch(f"{claims_prefix(stack.node)}*")
    try:
        async for entry in watcher:
            if entry is None or not entry.value:
                continue
            doc = decode(entry.value, CardClaims, what="claims")
            now = time.perf_counter()
            for claim in doc.claims.values():
                if claim.state == "active" and claim.resource_claim:
                    stamps.active.setdefault(claim.resource_claim, now)
            stamps.changed.set()
    finally:
        await watcher.stop()


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "g"}]}}],
        "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "big"}]}}


async def cycle(core: client.CoreV1Api, stamps: Stamps, i: int) -> Cycle:
    out = Cycle()
    name = f"p{i}"
    created = time.perf_counter()
    written = len(stamps.writes)
    await asyncio.to_thread(core.create_namespaced_pod, NAMESPACE, _pod(name))

    def allocated() -> tuple[str, float] | None:
        return next(((n, t) for n, t in stamps.allocated.items()
                     if n.startswith(f"{name}-") and t >= created), None)

    got = await stamps.until(allocated, f"claim of {name} allocated")
    if got is None:
        return out
    claim_name, out.allocated = got
    out.ready = await stamps.until(lambda: stamps.active.get(f"{NAMESPACE}/{claim_name}"),
                                   f"{claim_name} active")
    read = await asyncio.to_thread(client.ResourceV1Api(core.api_client)
                                   .read_namespaced_resource_claim, claim_name, NAMESPACE)
    device = read.status.allocation.devices.results[0].device
    generation = max((g for _, g, _ in stamps.offered), default=0)
    await asyncio.to_thread(core.delete_namespaced_pod, name, NAMESPACE)
    out.deleted = deleted = time.perf_counter()

    def back() -> float | None:
        return next((t for t, g, names in stamps.offered
                     if g > generation and device in names and t >= deleted), None)

    out.republished = await stamps.until(back, f"{device} offered again after {name}")
    mine = stamps.writes[written:]
    out.writes = len(mine)
    out.generations = len({g for _, g in mine})

    async def gone() -> bool:
        pods = await asyncio.to_thread(core.list_namespaced_pod, NAMESPACE)
        return not pods.items

    for _ in range(int(DEADLINE * 100)):  # untimed: the next cycle starts on an empty node
        if await gone():
            break
        await asyncio.sleep(0.01)
    return out


def _bystander(name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "nodeName": node, "containers": [{"name": "main", "image": "x"}]}}


async def quiet(core: client.CoreV1Api, stamps: Stamps, node: str, pods: int) -> Quiet:
    """Unrelated Pods come and go, one at a time, each seen Running then gone."""
    out = Quiet(pods=pods)
    written = len(stamps.writes)
    for i in range(pods):
        name = f"quiet-{i}"
        await asyncio.to_thread(core.create_namespaced_pod, NAMESPACE, _bystander(name, node))

        async def phase(name: str = name) -> str | None:
            try:
                pod = await asyncio.to_thread(core.read_namespaced_pod, name, NAMESPACE)
            except client.exceptions.ApiException:
                return None
            return str(pod.status.phase)

        for _ in range(int(DEADLINE * 100)):
            if await phase() == "Running":
                break
            await asyncio.sleep(0.01)
        await asyncio.to_thread(core.delete_namespaced_pod, name, NAMESPACE)
        for _ in range(int(DEADLINE * 100)):
            if await phase() is None:
                break
            await asyncio.sleep(0.01)
    await asyncio.sleep(1.0)  # what the last wake-up would have written has arrived
    out.writes = len(stamps.writes) - written
    return out


async def session(stack: Stack, cycles: int, bystanders: int) -> tuple[list[Cycle], Quiet]:
    api_client = config.new_client_from_config(config_file=str(stack.kubeconfig))
    core, resource = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    selector = f'device.attributes["{DRIVER}"].profile == "{PROFILE}"'
    await asyncio.to_thread(resource.create_namespaced_resource_claim_template, NAMESPACE, {
        "metadata": {"name": "big"}, "spec": {"spec": {"devices": {"requests": [{
            "name": "g", "exactly": {"deviceClassName": DRIVER,
                                     "selectors": [{"cel": {"expression": selector}}]}}]}}}})
    stamps = Stamps(asyncio.get_running_loop())
    threads = [threading.Thread(target=_watch_claims, args=(resource, stamps), daemon=True),
               threading.Thread(target=_watch_slices, args=(resource, stack.node, stamps),
                                daemon=True)]
    for thread in threads:
        thread.start()
    follower = asyncio.create_task(_follow_claims(stack, stamps))
    try:
        await stamps.until(lambda: stamps.offered or None, "the first slices")
        done = [await cycle(core, stamps, i) for i in range(cycles)]
        return done, await quiet(core, stamps, stack.node, bystanders)
    finally:
        stamps.stopping.set()
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


async def measure_async(cycles: int, bystanders: int
                        ) -> tuple[list[Cycle], Quiet, floor.Floors]:
    layout = Layout(Path(tempfile.mkdtemp(prefix="pk-bench-")))
    supervisor = Supervisor(layout.pids_file)
    try:
        layout.create()
        stack = await launch(layout, supervisor, mode="dra")
        try:
            done, still = await supervisor.guard(
                session(stack, cycles, bystanders),
                timeout=60 + (cycles + bystanders) * 3 * DEADLINE, what="the DRA benchmark",
                log=layout.log("allocator"))
            # the directory of the plugin socket kubelet calls NodePrepareResources on
            floors = await floor.measure(stack.nats_url,
                                         stack.config.kubelet_plugins_dir / DRIVER,
                                         auth=stack.auth)
            return done, still, floors
        finally:
            await stack.nc.close()
    finally:
        await supervisor.stop()
        shutil.rmtree(layout.root, ignore_errors=True)


def _between(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def report(cycles: list[Cycle], n: int, still: Quiet, floors: floor.Floors) -> list[str]:
    rows = {
        "prepare": Latency.of("claim allocated -> partition ready (prepare)",
                              [_between(c.allocated, c.ready) for c in cycles]),
        "republished": Latency.of("Pod deleted -> slices re-published",
                                  [_between(c.deleted, c.republished) for c in cycles]),
    }
    lines = [f"setup: one {PROFILE} Pod at a time on two H100-80GB, sim driver at zero latency, "
             f"watches stamped on arrival, deadline {DEADLINE:g} s per stamp; {len(cycles)} of "
             f"{n} cycles"]
    for key, row in rows.items():
        if row is not None:
            lines += [f"{row.label}: {row.text()}",
                      f"  {floor.row(key, row.p50, row.p99, floors)}"]
    lines += floors.lines()
    if cycles:
        writes = sorted(c.writes for c in cycles)
        most = max(c.generations for c in cycles)
        lines.append(f"slice writes per Pod cycle (2 changes): median {writes[len(writes) // 2]},"
                     f" max {writes[-1]}; pool generations per cycle at most {most} (goal: at "
                     "most 1 per change, 2 per cycle)")
    lines.append(f"slice writes on a quiet node while {still.pods} unrelated Pods came and went: "
                 f"{still.writes} (goal 0)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dra_latency")
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--quiet", type=int, default=10, metavar="PODS",
                        help="unrelated Pods that come and go on the quiet node")
    args = parser.parse_args(argv)
    try:
        cycles, still, floors = asyncio.run(measure_async(args.cycles, args.quiet))
    except StackError as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(report(cycles, args.cycles, still, floors)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
