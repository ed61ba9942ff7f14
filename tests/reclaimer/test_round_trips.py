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
from opentelemetry import trace as otel
from opentelemetry.sdk.trace import TracerProvider

from partkeeper.bus.permissions import inbox_prefix
from partkeeper.bus.trips import count, kinds
from partkeeper.config import Config
from partkeeper.drivers.base import Instance
from partkeeper_sim.driver import SimDriver
from partkeeper_sim.stack.natsserver import NatsServer
from schemas.names import encode_token
from services.reclaimer.main import serve
from tests_support import until
from tests_support.audit_hold import hold_audit
from tests_support.reclaimer import FAST, Hands, new_uid

# One PodGone for a Pod holding one active partition, the instance recorded on its claim (the
# common case): release, destroy, remove, each step of docs/reclaimer.md; see
# docs/benchmarks.md, "Reclaim".
RECLAIM = {
    # the claims: every card's (two here), to find the Pod's; then the card's before each step
    # (release, destroy, remove, and once more to see it gone); each compare-and-set writes
    # against the read its step was decided on
    "kv read pk-claims": 5,
    "kv cas pk-claims": 2,  # active -> releasing before the destroy, then removed after it
    "ack": 1,  # the PodGone, once handled
}
# Each transition's ClaimChanged, sent by the store's outbox after its write, in the PodGone's
# trace but no longer awaited by the steps (the entry is durable in the same write; the outbox
# re-sends what did not leave): the Pod is reclaimed while they are held up, and they follow.
ANNOUNCED = {"publish pk.parts": 2}


@pytest.fixture
async def counted(nats_server: NatsServer, node: str) -> AsyncIterator[Client]:
    # the service's own inbox, the one its peers answer (bus/rpc.py)
    nc = await nats.connect(nats_server.url,
                            inbox_prefix=inbox_prefix("reclaimer", encode_token(node)))
    yield nc
    await nc.close()


def count_enumerations(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The trace id of every card enumeration the sim driver serves from now on (the call runs
    in a worker thread, which carries the caller's context)."""
    made: list[str | None] = []
    real = SimDriver.instances

    def instances(self: SimDriver, card: int) -> list[Instance]:
        context = otel.get_current_span().get_span_context()
        made.append(f"{context.trace_id:032x}" if context.is_valid else None)
        return real(self, card)

    monkeypatch.setattr(SimDriver, "instances", instances)
    return made


async def test_reclaim_round_trips(hands: Hands, counted: Client, config: Config,
                                   watcher: object, monkeypatch: pytest.MonkeyPatch) -> None:
    uid = new_uid()
    enumerated = count_enumerations(monkeypatch)
    claim, inst = await hands.allocate(uid, card=0, start=2)
    trips = count(counted)
    held = hold_audit(counted)
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
        # One driver enumeration: the destroy step's look at the card. The release needs none
        # (decide.needs_sighting), and the removal follows the driver's confirmed destroy
        # without another (resolve._destroy).
        assert enumerated.count(trace_id) == 1
        held.set()
        total = RECLAIM | ANNOUNCED
        await until(lambda: len(trips.of_trace(trace_id)) == sum(total.values()),
                    "the announcements followed")
        made = trips.of_trace(trace_id)
        assert kinds(made) == total, "\n".join(f"{t.kind}: {t.subject}" for t in made)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
