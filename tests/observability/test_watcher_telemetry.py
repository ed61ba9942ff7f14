"""The watcher as a process (`python -m services.watcher`): the spans it exports over OTLP, the
trace context its Pod events carry, and its /metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from partkeeper.telemetry import tracing
from partkeeper_sim.apiserver import ApiServerThread
from partkeeper_sim.stack.natsserver import free_port
from schemas.names import STREAM_PARTITIONS, durable_name
from services.watcher.recorder import SERVICE
from tests_support import until
from tests_support.kubeclient import pod_manifest
from tests_support.observability import DEADLINE, scrape
from tests_support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests_support.watcher import Published, WatcherProcess

SPAN_KIND_PRODUCER = 4  # opentelemetry.proto.trace.v1.Span.SpanKind


def otlp_env(receiver: OtlpReceiver, **extra: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        **extra,
    }


async def delete_and_wait(
    apiserver: ApiServerThread, published: Published, node: str, name: str
) -> tuple[str, dict[str, str]]:
    """Create a Pod, wait for its PodSeen, delete it; returns its UID and PodGone's headers."""
    uid = apiserver.create_pod(pod_manifest(name, node=node))["metadata"]["uid"]
    await published.headers_of(uid, "PodSeen", DEADLINE)
    apiserver.delete_pod("default", name, grace_period_seconds=0)
    return uid, await published.headers_of(uid, "PodGone", DEADLINE)


async def one_pod_then_stop(
    starting: Awaitable[WatcherProcess], apiserver: ApiServerThread, published: Published,
    node: str, name: str,
) -> tuple[str, dict[str, str]]:
    """Start the watcher, take one Pod through it (delete_and_wait), stop it cleanly."""
    watcher = await starting
    uid, headers = await delete_and_wait(apiserver, published, node, name)
    assert await watcher.terminate() == 0
    return uid, headers


def is_span(uid: str, event: str) -> Any:
    def matches(span: ReceivedSpan) -> bool:
        return (span.name == f"watcher {event}" and span.attributes.get("pk.pod_uid") == uid
                and span.attributes.get("pk.event") == event)

    return matches


async def test_the_watchers_spans_reach_the_collector_and_podgone_carries_their_trace(
    apiserver: ApiServerThread, receiver: OtlpReceiver, watcher_process: Any, published: Published,
    node: str,
) -> None:
    watcher = await watcher_process(**otlp_env(receiver, OTEL_SERVICE_NAME="watcher-under-test"))
    uid, headers = await delete_and_wait(apiserver, published, node, "traced")

    seen = await receiver.wait_for_span(is_span(uid, "PodSeen"), DEADLINE)
    gone = await receiver.wait_for_span(is_span(uid, "PodGone"), DEADLINE)
    assert gone.service == seen.service == "watcher-under-test"
    assert gone.kind == SPAN_KIND_PRODUCER and gone.parent_id is None
    assert gone.attributes["pk.pod"] == "default/traced"
    assert gone.attributes["pk.reason"]
    # The reclaimer continues this trace: PodGone's traceparent names the exported span.
    assert tracing.trace_id_of(headers) == gone.trace_id
    assert headers["traceparent"].split("-")[2] == gone.span_id
    assert gone.trace_id != seen.trace_id, "two facts of one Pod share a trace"
    assert await watcher.terminate() == 0


async def test_spans_still_buffered_are_exported_when_the_watcher_stops(
    apiserver: ApiServerThread, receiver: OtlpReceiver, watcher_process: Any, published: Published,
    node: str,
) -> None:
    # A schedule delay far beyond the test: only the flush at shutdown can export them.
    uid, _ = await one_pod_then_stop(watcher_process(**otlp_env(
        receiver, OTEL_BSP_SCHEDULE_DELAY="600000")), apiserver, published, node, "flushed")
    (gone,) = receiver.find(is_span(uid, "PodGone"))
    assert gone.service == "partkeeper-watcher"


async def test_no_span_is_exported_when_the_exporter_is_none(
    apiserver: ApiServerThread, receiver: OtlpReceiver, watcher_process: Any, published: Published,
    node: str,
) -> None:
    _, headers = await one_pod_then_stop(watcher_process(**otlp_env(
        receiver, OTEL_TRACES_EXPORTER="none")), apiserver, published, node, "quiet")
    assert tracing.trace_id_of(headers) is not None, "context must travel even unexported"
    assert receiver.requests == 0


async def test_pod_events_move_the_counter_on_metrics(
    apiserver: ApiServerThread, watcher_process: Any, published: Published, node: str
) -> None:
    port = free_port()
    watcher = await watcher_process(PK_METRICS_PORT=str(port))
    uid = apiserver.create_pod(pod_manifest("counted", node=node))["metadata"]["uid"]
    await published.headers_of(uid, "PodSeen", DEADLINE)

    def count(kind: str) -> float:
        return scrape(port).get(("partkeeper_pod_events_total", (("type", kind),)), 0.0)

    async def moved(kind: str) -> bool:
        return await asyncio.to_thread(count, kind) >= 1

    await until(lambda: moved("PodSeen"), "PodSeen counted on /metrics", DEADLINE)
    assert await asyncio.to_thread(count, "PodGone") == 0
    apiserver.delete_pod("default", "counted", grace_period_seconds=0)
    await published.headers_of(uid, "PodGone", DEADLINE)
    await until(lambda: moved("PodGone"), "PodGone counted on /metrics", DEADLINE)
    samples = await asyncio.to_thread(scrape, port)
    durable = durable_name(SERVICE, node, STREAM_PARTITIONS)
    assert ("partkeeper_consumer_lag_messages", (("consumer", durable),)) in samples
    assert samples[("partkeeper_nats_connections", ())] == 1.0  # the process's connection is up
    assert await watcher.terminate() == 0
