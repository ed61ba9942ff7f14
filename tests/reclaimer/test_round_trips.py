"""The bus round trips of reclaiming one Pod after its deletion, counted and asserted: a change
that adds one fails here and says which (issue 27's guard, not a timing).

The reclaimer runs via `serve` on a connection of its own, counted by `partkeeper.bus.trips`;
the PodGone is published inside a span, so the reclaimer's trips for it are those made in that
trace (its consumer continues the event's traceparent; the fetch loop and the reconcile pass are
no part of it).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from opentelemetry.sdk.trace import TracerProvider
from reclaimer.reclaimer_harness import FAST, Hands, new_uid, until

from partkeeper.bus.trips import count, kinds
from partkeeper.config import Config
from partkeeper_sim.stack.natsserver import NatsServer
from services.reclaimer.main import serve

# One PodGone for a Pod holding one active partition, the instance recorded on its claim (the
# common case): release, destroy, remove, each step of docs/reclaimer.md; see
# docs/benchmarks.md, "Reclaim".
RECLAIM = {
    # the claims: every card's (two here), to find the Pod's; then the card's before each step
    # (release, destroy, remove, and once more to see it gone); each compare-and-set writes
    # against the read its step was decided on
    "kv read pk-claims": 5,
    "kv cas pk-claims": 2,  # active -> releasing before the destroy, then removed after it
    # each transition's ClaimChanged, sent by the store's outbox after its write (the service no
    # longer sends it a second time for the stream to drop as a duplicate)
    "publish pk.parts": 2,
    "ack": 1,  # the PodGone, once handled
}


@pytest.fixture
async def counted(nats_server: NatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_server.url)
    yield nc
    await nc.close()


async def test_reclaim_round_trips(hands: Hands, counted: Client, config: Config,
                                   watcher: object) -> None:
    uid = new_uid()
    claim, inst = await hands.allocate(uid, card=0, start=2)
    trips = count(counted)
    ready = asyncio.Event()
    task = asyncio.create_task(serve(dataclasses.replace(config, resync_seconds=3600), counted,
                                     ready=ready, tuning=FAST))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        tracer = TracerProvider().get_tracer("watcher")
        with tracer.start_as_current_span("watcher PodGone") as producer:
            seq = await hands.gone(uid)  # the publish injects this span's traceparent
        trace_id = f"{producer.get_span_context().trace_id:032x}"
        await until(lambda: hands.acked(seq), "the PodGone handled and acknowledged")
        assert await hands.removed(claim) and not await hands.exists(inst)
        made = trips.of_trace(trace_id)
        assert kinds(made) == RECLAIM, "\n".join(f"{t.kind}: {t.subject}" for t in made)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
