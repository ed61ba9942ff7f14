"""Prometheus metrics of all services, declared once. Each service exposes its own /metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

ALLOCATIONS = Counter(
    "partkeeper_allocations_total", "Allocate calls by resource and result", ["resource", "result"]
)
ALLOCATE_SECONDS = Histogram(
    "partkeeper_allocate_seconds", "Allocate latency", ["resource"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECLAIM_SECONDS = Histogram(
    "partkeeper_reclaim_seconds", "Pod gone (watcher observed) to instance destroyed",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
CAPACITY = Gauge(
    "partkeeper_capacity", "Advertised tokens per resource by health", ["resource", "health"]
)
FREE_PLACEMENTS = Gauge(
    "partkeeper_free_placements", "Instances of a profile that can be placed now", ["profile"]
)
FOREIGN_INSTANCES = Gauge("partkeeper_foreign_instances", "Physical instances with no claim")
DESTROY_FAILURES = Counter(
    "partkeeper_destroy_failures_total", "Failed destroys by reason", ["reason"]
)
DEAD_LETTERS = Counter(
    "partkeeper_dead_letters_total", "Messages copied to PK_DLQ", ["service", "stream"]
)
CONSUMER_LAG = Gauge(
    "partkeeper_consumer_lag", "Messages not yet delivered to a durable consumer", ["consumer"]
)
POD_EVENTS = Counter("partkeeper_pod_events_total", "Pod events published", ["type"])
KUBE_EVENTS = Counter(
    "partkeeper_kube_events_total",
    "Kubernetes Events the watcher recorded from the audit log, by reason and result",
    ["reason", "result"],
)
GC_COLLECTED = Counter("partkeeper_gc_collected_total", "Pod working directories collected")
GC_REFUSED = Counter("partkeeper_gc_refused_total", "Deletions refused, by reason", ["reason"])


def serve(port: int) -> None:
    """Expose /metrics on `port` (0 disables)."""
    if port:
        start_http_server(port)
        log.info("metrics on :%d/metrics", port)


async def track_lag(consumer: str, lag: Callable[[], Awaitable[int]], every: float) -> None:
    """Set the consumer-lag gauge of `consumer` every `every` seconds, until cancelled."""
    gauge = CONSUMER_LAG.labels(consumer=consumer)
    while True:
        try:
            gauge.set(await lag())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a metric must never stop the service
            log.debug("consumer lag of %s unavailable: %s", consumer, exc)
        await asyncio.sleep(every)
