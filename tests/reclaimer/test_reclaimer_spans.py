"""The reclaimer's spans: a Pod event's release, destroy and remove continue the event's trace,
the removal's audit entry carries the `remove` span on, and a refused destroy is an error span."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from partkeeper.bus import consumer
from partkeeper.telemetry import tracing
from schemas import ClaimChanged, PartitionEvent, decode
from schemas.names import parts_filter
from services.reclaimer import spans as reclaimer_spans
from tests_support import until
from tests_support.reclaimer import Hands, new_uid


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The consumer's and the job steps' spans, recorded in memory (no global provider)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    monkeypatch.setattr(consumer, "_tracer", tracer)
    monkeypatch.setattr(reclaimer_spans, "_tracer", tracer)
    yield exporter
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_pod_events_steps_are_children_of_its_consumption(
    hands: Hands, start_reclaimer, exported: InMemorySpanExporter, nc: Client, node: str
) -> None:
    headers: dict[str, dict[str, str]] = {}

    async def take(msg: Msg) -> None:
        event = decode(msg.data, PartitionEvent)
        if isinstance(event, ClaimChanged):
            headers[event.state] = dict(msg.headers or {})

    sub = await nc.subscribe(parts_filter(node), cb=take)
    uid = new_uid()
    claim, inst = await hands.allocate(uid, card=0, start=2)
    await start_reclaimer()
    tracer = TracerProvider().get_tracer("watcher")
    with tracer.start_as_current_span("watcher PodGone") as producer:
        await hands.gone(uid)  # the publish injects this span's traceparent
    # The consumption's span ends after its ack, a moment after the removal is published.
    await until(lambda: named(exported, "remove") and named(exported, "consume PK_PODS")
                and "removed" in headers, "the removal and the end of its consumption")
    await sub.unsubscribe()

    trace_id = producer.get_span_context().trace_id
    (consumed,) = named(exported, "consume PK_PODS")
    assert consumed.context.trace_id == trace_id
    for name in ("release", "destroy", "remove"):
        (span,) = named(exported, name)
        assert span.context.trace_id == trace_id and parent_of(span) == consumed.context.span_id
        assert span.attributes is not None
        assert span.attributes["pk.pod_uid"] == uid and span.attributes["pk.card"] == 0
        assert span.attributes["pk.claim_id"] == claim.id
        assert span.attributes["pk.profile"] == claim.profile
        assert span.attributes["pk.instance_uuid"] == inst.uuid
        assert span.status.status_code is not StatusCode.ERROR
    (remove,) = named(exported, "remove")
    # The allocator's capacity update continues the trace from this entry.
    carried = headers["removed"]
    assert tracing.trace_id_of(carried) == f"{trace_id:032x}"
    assert carried["traceparent"].split("-")[2] == f"{remove.context.span_id:016x}"


async def test_a_refused_destroy_is_an_error_span_naming_the_drivers_error(
    hands: Hands, start_reclaimer, exported: InMemorySpanExporter
) -> None:
    uid = new_uid()
    _, inst = await hands.allocate(uid)
    await asyncio.to_thread(hands.driver.set_busy, inst.uuid, True)
    await start_reclaimer()
    await hands.gone(uid)
    await until(lambda: named(exported, "destroy"), "a destroy attempt")
    failed = named(exported, "destroy")[0]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["pk.driver_error"] == "in_use"
    await asyncio.to_thread(hands.driver.set_busy, inst.uuid, False)
    await until(lambda: named(exported, "remove"), "the removal once the instance is free")
    assert named(exported, "destroy")[-1].status.status_code is not StatusCode.ERROR
