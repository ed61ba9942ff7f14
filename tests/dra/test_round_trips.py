"""The bus round trips of one DRA prepare, counted and asserted: a change that adds one fails here
and says which (issue 27's guard, not a timing).

The node's connection is counted by `partkeeper.bus.trips` and kubelet's NodePrepareResources
carries a `traceparent`, so the prepare's trips are those made in its trace (the slice publisher
and the claims watch that follow are other traces).
"""

from __future__ import annotations

import uuid

from partkeeper.bus.trips import count, kinds, new_trace
from partkeeper.kubelet import dra_pb2 as pb
from partkeeper.kubelet import dra_pb2_grpc, open_unix_channel
from tests_support import until
from tests_support.audit_hold import hold_audit
from tests_support.dra import dra_node

# One prepare of a claim the scheduler allocated, prepared once (the common case): see
# docs/benchmarks.md, "DRA prepare".
PREPARE = {
    # no read of the claims: the card's document as this allocator last read or wrote it, current
    # while the claims watch shows no newer revision (`state.Views`); both
    # compare-and-sets write against it, then against the first
    "kv cas pk-claims": 2,  # (none) -> creating before the driver; creating -> active after it
}
# Each transition's ClaimChanged, sent by the store's outbox after its write, in the prepare's
# trace but no longer awaited by it (the entry is durable in the same write; the outbox re-sends
# what did not leave): the prepare answers while they are held up, and they follow.
ANNOUNCED = {"publish pk.parts": 2}


async def test_prepare_round_trips(nc, js, node, kubeconfig) -> None:
    trips = count(nc)
    held = hold_audit(nc)
    async with dra_node(nc, node, kubeconfig) as stack:
        async def offered() -> bool:
            return "gpu-0-mig-1g10gb-6" in await stack.offered()

        await until(offered, "the slices offer 1g.10gb at 6")
        ref = await stack.allocated("c1", "gpu-0-mig-1g10gb-6", str(uuid.uuid4()), "p1")
        trace_id, metadata = new_trace()
        async with open_unix_channel(stack.service_socket) as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)
            reply = await stub.NodePrepareResources(
                pb.NodePrepareResourcesRequest(claims=[ref]), timeout=30, metadata=metadata)
        assert reply.claims[ref.uid].error == ""
        made = trips.of_trace(trace_id)
        assert kinds(made) == PREPARE, "\n".join(f"{t.kind}: {t.subject}" for t in made)
        held.set()
        total = PREPARE | ANNOUNCED
        await until(lambda: len(trips.of_trace(trace_id)) == sum(total.values()),
                    "the announcements followed")
        made = trips.of_trace(trace_id)
        assert kinds(made) == total, "\n".join(f"{t.kind}: {t.subject}" for t in made)

