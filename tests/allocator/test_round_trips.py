"""The bus round trips of one Allocate, counted and asserted: a change that adds one fails here
and says which (issue 27's guard, not a timing).

The allocator runs via `serve` on a connection of its own, counted by `partkeeper.bus.trips`;
kubelet's side is a gRPC client sending a `traceparent`, so the trips of the call are those made
in its trace (the recompute and the claims watch that follow are another trace). The watcher is a
stand-in answering `pods.pending` on another connection.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from opentelemetry import trace

from partkeeper.bus import ensure_topology
from partkeeper.bus.permissions import inbox_prefix
from partkeeper.bus.trips import Trips, count, kinds, new_trace
from partkeeper.drivers import Instance, InstanceSpec
from partkeeper.drivers.base import ContainerEdits
from partkeeper.kubelet import deviceplugin_pb2 as pb
from partkeeper.kubelet import deviceplugin_pb2_grpc, open_unix_channel
from partkeeper_sim.driver import SimDriver, init_state
from partkeeper_sim.stack.natsserver import NatsServer
from schemas import ContainerRequest, PodRecord, encode
from schemas.names import BUCKET_PODS, encode_token, pods_key
from services.allocator.core.options import Options
from services.allocator.deviceplugin.registration import endpoint_name
from services.allocator.main import serve as serve_allocator
from tests_support import until
from tests_support.audit_hold import hold_audit
from tests_support.lone_allocator import lone_config, pending_watcher

RESOURCE = "nvidia.com/mig-1g.10gb"

# One Allocate of a fresh Pod the kubelet admits once (the common case), on a node with room.
# Each line is a step of docs/contract.md section 5; see docs/benchmarks.md, "Allocate".
ALLOCATE = {
    # no read of the claims: the card's document as this allocator last read or wrote it is
    # current while the claims watch shows no newer revision (`state.Views`); the
    # retry check, the Pod lookup and the plan share it, and both compare-and-sets write against
    # it and then against the first one's revision
    "request pods.pending": 1,  # which Pod: the watcher's view
    "kv cas pk-claims": 2,  # (none) -> creating before the driver; creating -> active after it
}
# Each transition's ClaimChanged, sent by the store's outbox after its write, in the call's trace
# but no longer awaited by it (the entry is durable in the same write; the outbox re-sends what
# did not leave): the call replies while they are held up, and they follow. The service does not
# send them a second time for the stream to drop as a duplicate.
ANNOUNCED = {"publish pk.parts": 2}
# The driver calls of an Allocate planned on the views (the recompute's last enumeration is
# current, as after the start): no enumeration, the create, and the container edits (the
# descriptor's write shares their thread hop).
DRIVER_CALLS = {"create": 1, "container_edits": 1}


class Counted(SimDriver):
    """The sim driver, counting the Driver protocol's calls by name and trace: the thread hop
    carries the caller's context, so a call knows the operation it was made for (the recompute
    and the hardware poll enumerate in traces of their own)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: Counter[tuple[str, str]] = Counter()

    def of_trace(self, trace_id: str) -> dict[str, int]:
        return {name: n for (name, trace), n in self.calls.items() if trace == trace_id}

    def _count(self, name: str) -> None:
        trace_id = trace.get_current_span().get_span_context().trace_id
        self.calls[(name, format(trace_id, "032x"))] += 1

    def instances(self, card: int) -> list[Instance]:
        self._count("instances")
        return super().instances(card)

    def create(self, spec: InstanceSpec) -> Instance:
        self._count("create")
        return super().create(spec)

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        self._count("container_edits")
        return super().container_edits(instances)


def pod(node: str, i: int) -> PodRecord:
    return PodRecord(node=node, uid=str(uuid.uuid4()), namespace="rt", name=f"pod-{i}",
                     phase="Pending", state="live", created=f"{i:08d}",
                     containers=[ContainerRequest(name="main", requests={RESOURCE: 1})],
                     resource_version=str(i), updated_at=time.time())


@pytest.fixture
async def counted(nats_server: NatsServer, node: str) -> AsyncIterator[Client]:
    # the service's own inbox, the one its peers answer (bus/rpc.py)
    nc = await nats.connect(nats_server.url,
                            inbox_prefix=inbox_prefix("allocator", encode_token(node)))
    yield nc
    await nc.close()


async def test_allocate_round_trips(nc: Client, counted: Client, node: str) -> None:
    js = nc.jetstream()
    await ensure_topology(js)
    directory = Path(tempfile.mkdtemp(prefix="pk", dir="/tmp"))
    init_state(directory / "sim.json", ["H100-80GB"], [])
    pending: list[PodRecord] = []
    watcher = await pending_watcher(nc, node, pending)
    config = lone_config(directory, node)
    trips: Trips = count(counted)
    held = hold_audit(counted)
    ready = asyncio.Event()
    driver = Counted(directory / "sim.json")
    task = asyncio.create_task(serve_allocator(
        config, counted, ready=ready, options=Options(driver=driver)))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        pods_kv = await js.key_value(BUCKET_PODS)
        seen = []
        async with open_unix_channel(config.kubelet_dir / endpoint_name(RESOURCE)) as channel:
            stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
            for i, token in enumerate(["1g.10gb-0", "1g.10gb-1"]):
                record = pod(node, i)
                await pods_kv.put(pods_key(node, record.uid), encode(record))
                pending[:] = [record]
                trace_id, metadata = new_trace()
                await stub.Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[token])]), timeout=30,
                    metadata=metadata)
                seen.append(trace_id)
                if i == 0:  # the start's recompute enumerated, and nothing has moved since
                    assert driver.of_trace(trace_id) == DRIVER_CALLS
        for trace_id in seen:  # the audit is still held up: what the calls waited for
            made = trips.of_trace(trace_id)
            assert kinds(made) == ALLOCATE, "\n".join(f"{t.kind}: {t.subject}" for t in made)
        held.set()
        for trace_id in seen:
            await until(lambda t=trace_id: len(trips.of_trace(t)) == sum(  # type: ignore[misc]
                (ALLOCATE | ANNOUNCED).values()), "the announcements followed", 10)
            made = trips.of_trace(trace_id)
            assert kinds(made) == ALLOCATE | ANNOUNCED, "\n".join(
                f"{t.kind}: {t.subject}" for t in made)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await watcher.stop()
        shutil.rmtree(directory, ignore_errors=True)
