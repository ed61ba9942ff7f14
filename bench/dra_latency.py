"""DRA latency: `python -m bench.dra_latency [--cycles 50]`.

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

Every wait has a deadline; a miss counts as infinitely slow. No goal is set: the device-plugin
figures (reclaim latency) are the comparison.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from bench.figures import Latency
from partkeeper.dra import DRIVER
from partkeeper.stack.launch import Stack, launch
from partkeeper.stack.layout import Layout
from partkeeper.stack.processes import StackError, Supervisor
from schemas import CardClaims, decode
from schemas.names import BUCKET_CLAIMS, claims_prefix

NAME = "DRA latency"
NAMESPACE = "bench"
PROFILE = "7g.80gb"
DEADLINE = 20.0


@dataclass
class Cycle:
    allocated: float | None = None
    ready: float | None = None
    deleted: float | None = None
    republished: float | None = None


class Stamps:
    """Events from watch threads and the KV watch, stamped on arrival, woken by a condition."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.changed = asyncio.Event()
        self.allocated: dict[str, float] = {}  # claim name -> first seen allocated
        self.active: dict[str, float] = {}  # ResourceClaim namespace/name -> first seen active
        self.offered: list[tuple[float, int, set[str]]] = []  # (when, generation, devices)
        self.stopping = threading.Event()

    def note(self, record: Any) -> None:
        self.loop.call_soon_threadsafe(self._note, time.perf_counter(), record)

    def _note(self, when: float, record: Any) -> None:
        kind, value = record
        if kind == "claim":
            self.allocated.setdefault(value, when)
        elif kind == "slice":
            self.offered.append((when, *value))
        self.changed.set()

    async def until(self, check: Any, what: str) -> float | None:
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
    out.deleted = time.perf_counter()

    def back() -> float | None:
        return next((t for t, g, names in stamps.offered
                     if g > generation and device in names and t >= out.deleted), None)

    out.republished = await stamps.until(back, f"{device} offered again after {name}")

    async def gone() -> bool:
        pods = await asyncio.to_thread(core.list_namespaced_pod, NAMESPACE)
        return not pods.items

    for _ in range(int(DEADLINE * 100)):  # untimed: the next cycle starts on an empty node
        if await gone():
            break
        await asyncio.sleep(0.01)
    return out


async def session(stack: Stack, cycles: int) -> list[Cycle]:
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
        return [await cycle(core, stamps, i) for i in range(cycles)]
    finally:
        stamps.stopping.set()
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


async def measure_async(cycles: int) -> list[Cycle]:
    layout = Layout(Path(tempfile.mkdtemp(prefix="pk-bench-")))
    supervisor = Supervisor(layout.pids_file)
    try:
        layout.create()
        stack = await launch(layout, supervisor, mode="dra")
        try:
            return await supervisor.guard(session(stack, cycles), timeout=60 + cycles * 3 *
                                          DEADLINE, what="the DRA benchmark",
                                          log=layout.log("allocator"))
        finally:
            await stack.nc.close()
    finally:
        await supervisor.stop()
        shutil.rmtree(layout.root, ignore_errors=True)


def _between(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def report(cycles: list[Cycle], n: int) -> list[str]:
    rows = [
        Latency.of("claim allocated -> partition ready (prepare)",
                   [_between(c.allocated, c.ready) for c in cycles]),
        Latency.of("Pod deleted -> slices re-published",
                   [_between(c.deleted, c.republished) for c in cycles]),
    ]
    lines = [f"setup: one {PROFILE} Pod at a time on two H100-80GB, sim driver at zero latency, "
             f"watches stamped on arrival, deadline {DEADLINE:g} s per stamp; {len(cycles)} of "
             f"{n} cycles"]
    lines += [f"{row.label}: {row.text()}" for row in rows if row is not None]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dra_latency")
    parser.add_argument("--cycles", type=int, default=50)
    args = parser.parse_args(argv)
    try:
        cycles = asyncio.run(measure_async(args.cycles))
    except StackError as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(report(cycles, args.cycles)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
