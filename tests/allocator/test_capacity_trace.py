"""The capacity update after a removal, in the removal's trace: `Recompute.refresh` waits for a
pass that read after it (never holding the loop), and a `ClaimChanged(removed)` on the audit
stream becomes a `capacity update` span continuing the entry's traceparent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from nats.js import JetStreamContext
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from partkeeper.bus import publish
from schemas import ClaimChanged
from schemas.names import STREAM_PARTITIONS, parts_filter, parts_subject
from services.allocator.core.recompute import Recompute
from services.allocator.core.state import Changes
from services.allocator.deviceplugin import removals
from tests_support import until
from tests_support.allocator import node_stack


async def _nothing_in_flight() -> None:
    """`Context.quiet` with no Allocate in flight."""


class Passes(Recompute):
    """The recompute loop over a pass that only counts, and holds where a test says."""

    def __init__(self) -> None:
        ctx: Any = SimpleNamespace(changes=Changes(), quiet=_nothing_in_flight)
        super().__init__(ctx, {}, None)  # type: ignore[arg-type]  # a stand-in context, not a full Context
        self.reads = 0
        self.hold: dict[int, asyncio.Event] = {}
        self.ok = True

    async def once(self) -> bool:
        self.reads += 1
        gate = self.hold.get(self.reads)
        if gate is not None:
            await gate.wait()
        return self.ok


async def running(passes: Passes) -> asyncio.Task[None]:
    first = asyncio.Event()
    task = asyncio.create_task(passes.run(first), name="recompute under test")
    passes.ctx.changes.touch()
    await until(first.is_set, "the first pass")
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_refresh_waits_for_a_pass_that_read_after_it() -> None:
    passes = Passes()
    passes.hold = {2: asyncio.Event(), 3: asyncio.Event()}
    task = await running(passes)
    try:
        passes.ctx.changes.touch()
        await until(lambda: passes.reads == 2, "a pass in progress")
        waiter = asyncio.create_task(passes.refresh(10.0))
        await until(lambda: passes.ctx.changes.touches == 3, "refresh woke the recompute")
        passes.hold[2].set()  # this pass read before the refresh: it must not end the wait
        await until(lambda: passes.reads == 3, "the pass the refresh asked for")
        assert passes.pushed == 2 and not waiter.done()
        passes.hold[3].set()
        assert await asyncio.wait_for(waiter, 10.0) is True
        assert passes.pushed == 3
    finally:
        await stop(task)


async def test_refresh_gives_up_at_its_bound_and_the_passes_go_on() -> None:
    passes = Passes()
    task = await running(passes)
    try:
        passes.ok = False  # every pass fails to read: nothing is pushed
        before = passes.reads
        assert await passes.refresh(0.2) is False
        assert passes.reads > before
    finally:
        await stop(task)


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(removals, "_tracer", provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


async def following(js: JetStreamContext, node: str) -> bool:
    """Whether the allocator's ephemeral consumer of the node's partition subjects exists."""
    found = await js.consumers_info(STREAM_PARTITIONS)
    return any(c.config.filter_subject == parts_filter(node) and not c.config.durable_name
               for c in found)


def removal(node: str) -> ClaimChanged:
    return ClaimChanged(
        node=node, at=time.time(), card=0, claim_id="c0ffee", pod_uid="0b6f0000-0000-4000-8000-"
        "000000000001", namespace="ml", name="train-0", container="main", profile="1g.10gb",
        start=2, size=2, state="removed", instance_uuid="MIG-test", reason="destroyed",
    )


def captured(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "capacity update"]


async def test_a_removal_becomes_a_capacity_update_span_in_its_trace(
    nc, js, node: str, exported: InMemorySpanExporter
) -> None:
    async with node_stack(nc, node):
        await until(lambda: following(js, node), "the allocator follows the audit stream")
        reclaim = TracerProvider().get_tracer("reclaimer")
        other = msgspec.structs.replace(removal(node), state="active")
        await publish(js, parts_subject(node, 0), other, msg_id="claim/c0ffee/active")
        with reclaim.start_as_current_span("remove") as remove:
            await publish(js, parts_subject(node, 0), removal(node), msg_id="claim/c0ffee/removed")
        await until(lambda: captured(exported), "the capacity update span")
    (update,) = captured(exported)  # entries in order: the `active` one opened none
    assert update.context.trace_id == remove.get_span_context().trace_id
    assert update.parent is not None
    assert update.parent.span_id == remove.get_span_context().span_id
    assert update.kind is SpanKind.CONSUMER
    assert update.status.status_code is not StatusCode.ERROR
    attributes = dict(update.attributes or {})
    assert attributes["pk.pod_uid"] == removal(node).pod_uid
    assert (attributes["pk.card"], attributes["pk.profile"]) == (0, "1g.10gb")
    assert attributes["pk.claim_id"] == "c0ffee"
    recompute_pass = attributes["pk.recompute_pass"]
    assert isinstance(recompute_pass, int) and recompute_pass >= 1
    assert attributes["pk.free_placements"] == 7  # nothing held on the one H100
