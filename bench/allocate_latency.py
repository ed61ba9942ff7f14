"""Allocate latency: `python -m bench.allocate_latency [--calls 500]`.

A real nats-server, the allocator via `serve` with the sim driver at zero latency, and kubelet's
side played by a gRPC client calling Allocate on the plugin socket. Each call serves a fresh
pending Pod (answered by a minimal `pods.pending` service); between calls, untimed, the partition
is reclaimed as the reclaimer would (release, destroy, remove) so every call finds room. Prints
p50 and p99 of the whole gRPC call, which includes finding the Pod, the claim writes (CAS), the
create, the audit events and the descriptor, beside the floor measured in the same run on the
same nats-server and socket directory (bench.floors), and the goal issue 27 states (Allocate p99
< 10 ms).

The allocator's connection is counted (partkeeper.bus.trips) and each call carries a
`traceparent`, so the run also prints the profile of an Allocate: its round trips per call, by
kind, with the time spent in them, what is left outside them, and the allocator's spans.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats.micro.service import Service
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from bench import floors as floor
from partkeeper import heap
from partkeeper.bus import ensure_topology
from partkeeper.bus.kv import Bucket
from partkeeper.bus.permissions import ADMIN, inbox_prefix
from partkeeper.bus.trips import Trip, Trips, count, new_trace
from partkeeper.claims import ClaimsStore, inventory, machine
from partkeeper.config import Config
from partkeeper.kubelet import deviceplugin_pb2 as pb
from partkeeper.kubelet import deviceplugin_pb2_grpc, open_unix_channel
from partkeeper_sim.driver import SimDriver, init_state
from partkeeper_sim.stack.natsserver import NatsServer
from schemas import (
    ContainerRequest,
    NodeCapacity,
    PodRecord,
    decode,
    encode,
)
from schemas.names import (
    BUCKET_CAPACITY,
    BUCKET_CLAIMS,
    BUCKET_PODS,
    capacity_key,
    encode_token,
    pods_key,
)
from services.allocator.core.options import Options
from services.allocator.deviceplugin.registration import endpoint_name
from services.allocator.main import serve as serve_allocator
from tests_support.lone_allocator import lone_config, pending_watcher

NODE = "bench-node"
RESOURCE = "nvidia.com/mig-1g.10gb"
TOKEN = "1g.10gb-0"
FREE_WHEN_EMPTY = 7


class Serialised:
    """The sim driver behind one thread lock, shared by the allocator and the bench's stand-in
    reclaimer: in one process, threads would otherwise meet at the state file's lock, whose
    waiters poll every 50 ms, and the figures would measure that polling, not the allocator."""

    name = "sim"

    def __init__(self, driver: SimDriver) -> None:
        self._driver = driver
        self._lock = threading.Lock()

    def __getattr__(self, attr: str) -> Any:
        method = getattr(self._driver, attr)

        def call(*args: Any) -> Any:
            with self._lock:
                return method(*args)

        return call


class Durations(SpanExporter):
    """Each finished span's name and duration, nothing else. Keeping the spans themselves (the
    SDK's InMemorySpanExporter) kept some 3,300 spans alive per 300 calls; the collector then
    paused the calls it fell in, 2-7 ms for a young generation and 70-82 ms for the oldest, and
    the figures measured the benchmark's own memory."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            if span.end_time is not None and span.start_time is not None:
                self.seconds.setdefault(span.name, []).append(
                    (span.end_time - span.start_time) / 1e9)
        return SpanExportResult.SUCCESS

    def clear(self) -> None:
        self.seconds = {}


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


@dataclass
class Run:
    samples: list[float]
    trips: list[list[Trip]]  # per timed call, the allocator's round trips in its trace
    floors: floor.Floors
    spans: dict[str, list[float]]  # the allocator's span durations (s) by name, timed calls


@dataclass
class LoneNode:
    """One allocator on its own over the sim driver (one H100), started: the bench's connection
    and the allocator's, the stand-in watcher answering `pods.pending` from `pending`."""

    server: NatsServer
    directory: Path
    nc: Client  # the bench's own
    allocator_nc: Client  # the allocator's
    config: Config
    driver: Serialised
    pending: list[PodRecord]
    watcher: Service


@contextlib.asynccontextmanager
async def lone_node(where: str, node: str = NODE) -> AsyncIterator[LoneNode]:
    """A real nats-server with the topology, the allocator serving `node` until the block ends,
    everything removed after it."""
    server = NatsServer().start()
    directory = Path(tempfile.mkdtemp(prefix="pk", dir=where))
    # the node's operators' inbox: the services answer their node's inboxes only
    inbox = inbox_prefix(ADMIN, encode_token(node))
    nc = await nats.connect(server.url, inbox_prefix=inbox)
    allocator_nc = await nats.connect(server.url, inbox_prefix=inbox)
    tasks: list[asyncio.Task[None]] = []
    try:
        await ensure_topology(nc.jetstream())
        init_state(directory / "sim.json", ["H100-80GB"], [])
        driver = Serialised(SimDriver(directory / "sim.json"))
        pending: list[PodRecord] = []
        watcher = await pending_watcher(nc, node, pending)
        config = lone_config(directory, node)
        ready = asyncio.Event()
        tasks.append(asyncio.create_task(serve_allocator(config, allocator_nc, ready=ready,
                                                         options=Options(driver=driver))))
        await asyncio.wait_for(ready.wait(), 30)
        yield LoneNode(server, directory, nc, allocator_nc, config, driver, pending, watcher)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await allocator_nc.close()
        await nc.drain()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(server.store_dir, ignore_errors=True)


async def run(calls: int, warmup: int, where: str, floor_calls: int) -> Run:
    # The allocator's own spans (Allocate, pod lookup, claim, create, activate, descriptor),
    # kept in memory: the steps of the profile.
    exporter = Durations()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    async with lone_node(where) as lone:
        # Counted from here: every request and publish the allocator makes, by trace.
        trips = count(lone.allocator_nc)
        heap.freeze_startup()  # as the service's runner does once it is ready
        js = lone.nc.jetstream()
        samples, made = await _measure(js, lone.config, lone.driver, lone.pending, warmup, trips)
        exporter.clear()
        samples, made = await _measure(js, lone.config, lone.driver, lone.pending, calls, trips)
        spans = exporter.seconds
        await lone.watcher.stop()
        floors = await floor.measure(lone.server.url, lone.directory, floor_calls)
        return Run(samples, made, floors, spans)


async def _measure(
    js: JetStreamContext, config: Config, driver: Serialised, pending: list[PodRecord], n: int,
    trips: Trips,
) -> tuple[list[float], list[list[Trip]]]:
    """`n` timed Allocates, each for a fresh pending Pod, with an untimed reclaim in between."""
    pods_kv = await js.key_value(BUCKET_PODS)
    store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), NODE)
    capacity_kv = await js.key_value(BUCKET_CAPACITY)
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=[TOKEN])])
    samples: list[float] = []
    made: list[list[Trip]] = []
    async with open_unix_channel(config.kubelet_dir / endpoint_name(RESOURCE)) as channel:
        stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
        for i in range(n):
            record = _pod(i)
            await pods_kv.put(pods_key(NODE, record.uid), encode(record))
            pending[:] = [record]
            trace_id, metadata = new_trace()
            started = time.perf_counter()
            await stub.Allocate(request, timeout=30, metadata=metadata)
            samples.append(time.perf_counter() - started)
            made.append(trips.of_trace(trace_id))
            trips.clear()
            pending.clear()
            await _reclaim(store, driver)
            await _advertised(capacity_kv)
    return samples, made


def steps(spans: dict[str, list[float]], calls: int) -> list[str]:
    """The allocator's spans, mean ms per call (nested: Allocate holds the others)."""
    lines = [f"steps (the allocator's spans, mean per call over {calls} calls):"]
    for name, seconds in sorted(spans.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {name}: {sum(seconds) / calls * 1000:.2f} ms "
                     f"({len(seconds) / calls:.1f} per call)")
    return lines


def profile(samples: list[float], made: list[list[Trip]]) -> list[str]:
    """Where an Allocate's time goes: its round trips by kind (count and mean time per call),
    and the rest, spent in the allocator itself (driver, descriptor, CDI, encoding, the loop)."""
    calls = len(made)
    by_kind: dict[str, list[float]] = {}
    for trips in made:
        for trip in trips:
            by_kind.setdefault(trip.kind, []).append(trip.seconds)
    total = statistics.fmean(samples) * 1000
    lines = [f"profile (mean per call over {calls} calls, {total:.2f} ms in all; the allocator's "
             "round trips, in its trace):"]
    spent = 0.0
    for kind, seconds in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        per_call = sum(seconds) / calls * 1000
        spent += per_call
        lines.append(f"  {len(seconds) / calls:.1f} x {kind}: {per_call:.2f} ms")
    lines.append(f"  outside round trips (gRPC call itself, driver, descriptor, CDI, "
                 f"encoding, the event loop): {total - spent:.2f} ms")
    return lines


async def _advertised(kv: KeyValue) -> None:
    """Wait, as kubelet does, until the freed slot is advertised again before the next call."""
    for _attempt in range(1, 1000):
        doc = decode((await kv.get(capacity_key(NODE))).value or b"", NodeCapacity)
        if doc.resources[RESOURCE].free == FREE_WHEN_EMPTY and not doc.cards[0].instances:
            return
        await asyncio.sleep(0.002)
    raise RuntimeError("the freed slot was never advertised again")


def _pod(i: int) -> PodRecord:
    return PodRecord(
        node=NODE, uid=str(uuid.uuid4()), namespace="bench", name=f"pod-{i}", phase="Pending",
        state="live", created=f"{i:08d}",
        containers=[ContainerRequest(name="main", requests={RESOURCE: 1})],
        resource_version=str(i), updated_at=time.time(),
    )


async def _reclaim(store: ClaimsStore, driver: Serialised) -> None:
    """What the reclaimer does once the Pod is gone: release, destroy, remove."""
    doc, _ = await store.read(0)
    for claim_id in list(doc.claims):
        await _reclaim_claim(store, driver, claim_id)


async def _reclaim_claim(store: ClaimsStore, driver: Serialised, claim_id: str) -> None:
    await store.update(0, lambda d: machine.release(d, claim_id, "bench", time.time()))
    doc, _ = await store.read(0)
    inv = inventory.classify(doc, await asyncio.to_thread(driver.instances, 0),
                             driver.same_partition)
    inst = inv.owned.get(claim_id)
    if inst is not None:
        await asyncio.to_thread(driver.destroy, inst)
    await store.update(0, lambda d: machine.remove(d, claim_id))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocate_latency", description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--floor-calls", type=int, default=floor.DEFAULT_CALLS,
                        help="calls per floor round trip")
    parser.add_argument("--dir", default="/tmp", help="where the sim state and PK_PODS_DIR live "
                        "(a tmpfs such as /dev/shm leaves the disk out)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    done = asyncio.run(run(args.calls, args.warmup, args.dir, args.floor_calls))
    ms = [s * 1000 for s in done.samples]
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    print(f"allocate latency over {len(ms)} calls (sim driver, zero latency, files in "
          f"{args.dir}): "
          f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
          f"mean {statistics.fmean(ms):.2f} ms, max {max(ms):.2f} ms")
    print(f"  {floor.row('allocate', p50, p99, done.floors)}")
    print("\n".join(done.floors.lines()))
    print("\n".join(profile(done.samples, done.trips)))
    print("\n".join(steps(done.spans, len(done.samples))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
