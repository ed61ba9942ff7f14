"""Prometheus metrics of all services, declared once. Each service exposes its own /metrics.

Names follow Prometheus conventions: a unit suffix in base units (`_seconds`, `_devices`,
`_instances`, `_messages`), `_total` on counters, and `partkeeper_build_info` (always 1) carrying
the version as a label.
"""

from __future__ import annotations

import json
import logging
import platform
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

import partkeeper
from partkeeper.health import HEALTH, Health

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
    "partkeeper_capacity_devices", "Advertised device-plugin tokens per resource by health",
    ["resource", "health"],
)
FREE_PLACEMENTS = Gauge(
    "partkeeper_placeable_instances", "Instances of a profile that can be placed now", ["profile"]
)
FOREIGN_INSTANCES = Gauge("partkeeper_foreign_instances", "Physical instances with no claim")
CARD_EVENTS = Counter(
    "partkeeper_card_events_total",
    "Card events the driver reported, by card and cause (`xid-79`, `ecc`, `lost`, ...)",
    ["card", "cause"],
)
CARD_FAILED = Gauge(
    "partkeeper_card_failed_devices",
    "1 while a card is failed (taking no partitions), by its cause",
    ["card", "cause"],
)
DESTROY_FAILURES = Counter(
    "partkeeper_destroy_failures_total", "Failed destroys by reason", ["reason"]
)
DEAD_LETTERS = Counter(
    "partkeeper_dead_letters_total", "Messages copied to PK_DLQ", ["service", "stream"]
)
CONSUMER_LAG = Gauge(
    "partkeeper_consumer_lag_messages", "Messages not yet delivered to a durable consumer",
    ["consumer"],
)
REDELIVERIES = Counter(
    "partkeeper_redeliveries_total",
    "Messages delivered again to a durable consumer (not acknowledged in time, or nak'd)",
    ["consumer"],
)
DEAD_LETTER_DEPTH = Gauge(
    "partkeeper_dead_letter_messages", "Messages held in PK_DLQ under a consumer's subject",
    ["subject"],
)
NATS_CONNECTIONS = Gauge(
    "partkeeper_nats_connections", "1 while the service's NATS connection is up, 0 while it "
    "reconnects",
)
CLAIMS = Gauge(
    "partkeeper_claimed_instances", "Claims in the store by profile (\"sliced\" for slices) and "
    "state", ["profile", "state"],
)
PARTITION_INFO = Gauge(
    "partkeeper_partition_info", "Always 1, one series per partition and container using it: "
    "the MIG device (`uuid`, `gpu_instance_id`, `compute_instance_id`, `card_uuid`, `profile`) "
    "and its Pod (`pod`, `namespace`, `container`), for joins with the DCGM exporter's series "
    "(docs/observability.md)",
    ["uuid", "gpu_instance_id", "compute_instance_id", "card_uuid", "profile", "pod",
     "namespace", "container"],
)
SLICE_LIMITER = Gauge(
    "partkeeper_slice_limiter_info", "Always 1; the labels say who enforces logical slices "
    "(`limiter` none or hami-core) and whether it does (`enforced`)", ["limiter", "enforced"],
)
REQUESTS_DROPPED = Counter(
    "partkeeper_requests_dropped_total", "Requests a service left unanswered because their reply "
    "subject is no inbox of an asker the permissions name (a reply there would be a write)",
    ["endpoint"],
)
POD_EVENTS = Counter("partkeeper_pod_events_total", "Pod events published", ["type"])
KUBE_EVENTS = Counter(
    "partkeeper_kube_events_total",
    "Kubernetes Events the watcher recorded from the audit log, by reason and result",
    ["reason", "result"],
)
GC_COLLECTED = Counter("partkeeper_gc_collected_total", "Pod working directories collected")
GC_REFUSED = Counter("partkeeper_gc_refused_total", "Deletions refused, by reason", ["reason"])
BUILD_INFO = Gauge(
    "partkeeper_build_info", "Always 1; the labels say which build runs", ["version", "python"]
)
BUILD_INFO.labels(partkeeper.__version__, platform.python_version()).set(1)


def serve(port: int, health: Health = HEALTH, host: str = "") -> ThreadingHTTPServer | None:
    """Serve /metrics, /livez and /readyz on `port` (0 disables) from a daemon thread."""
    if not port:
        return None
    server = ThreadingHTTPServer((host, port), _handler(health))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    log.info("metrics on :%d/metrics, probes on /livez and /readyz", server.server_port)
    return server


def _handler(health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif path == "/livez":
                live, age = health.liveness()
                body: dict[str, object] = {"live": live, "seconds_since_beat": age}
                self._send(200 if live else 503, json.dumps(body).encode(), "application/json")
            elif path == "/readyz":
                ready, conditions = health.readiness()
                body = {"ready": ready, "conditions": conditions}
                self._send(200 if ready else 503, json.dumps(body).encode(), "application/json")
            else:
                self._send(404, b"not found: try /metrics, /livez or /readyz\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Probes every few seconds are not worth a log line."""

    return Handler
