"""OpenTelemetry tracing: setup from the standard OTEL_* variables, W3C context in headers.

Spans are always created and their context always propagated (NATS headers, gRPC metadata), so
trace ids travel across services even when this process exports nothing. What is exported, and
where, is decided by the standard variables (docs/observability.md):

- `OTEL_TRACES_EXPORTER`: `otlp`, `console`, `none` (comma-separated). Unset: `otlp` when an
  OTLP endpoint is configured, nothing otherwise (a node agent must not try localhost:4317 on
  every node that has no collector).
- `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`
  (default `http://localhost:4317`); OTLP over gRPC only.
- `OTEL_EXPORTER_OTLP_TRACES_INSECURE`, else `OTEL_EXPORTER_OTLP_INSECURE`; an `https` endpoint is
  always TLS, otherwise an unset flag means plaintext exactly when the scheme is `http`.
- `OTEL_SERVICE_NAME` (default `partkeeper-<service>`), `OTEL_RESOURCE_ATTRIBUTES`,
  `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, `OTEL_SDK_DISABLED`: as the SDK reads them.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

log = logging.getLogger(__name__)

DEFAULT_OTLP_ENDPOINT = "http://localhost:4317"
KNOWN_EXPORTERS = frozenset({"otlp", "console"})
FLUSH_SECONDS = 5.0  # bounds the exit of a process whose collector is away

_configured = False


@dataclass(frozen=True, slots=True)
class OtlpTarget:
    endpoint: str
    insecure: bool


def exporters(env: Mapping[str, str]) -> tuple[str, ...]:
    """The span exporters the environment asks for, in order; () exports nothing."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ("otlp",) if endpoint and endpoint.strip() else ()
    names = tuple(dict.fromkeys(n.strip().lower() for n in raw.split(",") if n.strip()))
    return () if "none" in names else names


def otlp_target(env: Mapping[str, str]) -> OtlpTarget:
    """Where OTLP spans go and whether the channel is plaintext, as the OTLP spec reads it."""
    endpoint = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or DEFAULT_OTLP_ENDPOINT
    )
    flag = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_INSECURE", "").strip()
    )
    scheme = urlparse(endpoint).scheme.lower()
    if scheme == "https":
        insecure = False
    elif flag:
        insecure = flag.lower() == "true"
    else:
        insecure = scheme == "http"
    return OtlpTarget(endpoint, insecure)


def setup(service: str, env: Mapping[str, str] | None = None) -> None:
    """Install this process's tracer provider (once) with the exporters the environment names."""
    global _configured
    if _configured:
        return
    _configured = True
    env = os.environ if env is None else env
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    name = env.get("OTEL_SERVICE_NAME") or f"partkeeper-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    for exporter in exporters(env):
        _add_exporter(provider, exporter, env)
    trace.set_tracer_provider(provider)


def _add_exporter(provider: Any, name: str, env: Mapping[str, str]) -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if name == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    elif name == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
        )
        if protocol.strip() not in ("", "grpc"):
            log.warning("OTLP protocol %r is not available here; exporting over gRPC", protocol)
        target = otlp_target(env)
        exporter = OTLPSpanExporter(endpoint=target.endpoint, insecure=target.insecure)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        log.info("exporting spans over OTLP/gRPC to %s (%s)", target.endpoint,
                 "plaintext" if target.insecure else "TLS")
    else:
        log.warning("OTEL_TRACES_EXPORTER names %r, which this build does not ship; ignored "
                    "(known: %s)", name, ", ".join(sorted(KNOWN_EXPORTERS)))


def shutdown(timeout: float = FLUSH_SECONDS) -> None:
    """Export what is buffered (bounded by `timeout`), then close the exporters."""
    provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is not None and not flush(int(timeout * 1000)):
        log.warning("some spans could not be exported within %.0fs of stopping", timeout)
    close = getattr(provider, "shutdown", None)
    if close is not None:
        close()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add `traceparent` (and `tracestate`) of the current span to `headers`."""
    propagate.inject(headers)
    return headers


def extract(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The context carried by `headers`, to parent the spans of a handler."""
    return propagate.extract(dict(headers or {}))


@contextmanager
def span_from(
    headers: Mapping[str, str] | None,
    name: str,
    *,
    kind: SpanKind = SpanKind.CONSUMER,
    attributes: Mapping[str, Any] | None = None,
    tracer: trace.Tracer | None = None,
) -> Iterator[trace.Span]:
    """A current span continuing the trace carried by incoming `headers` (a NATS message's, a
    request's); a new trace when they carry none."""
    chosen = tracer or trace.get_tracer(__name__)
    with chosen.start_as_current_span(
        name, context=extract(headers), kind=kind, attributes=dict(attributes or {})
    ) as span:
        yield span


def trace_id_of(headers: Mapping[str, str] | None) -> str | None:
    """The 32-hex trace id a `traceparent` header names, or None when there is no valid one."""
    span = trace.get_current_span(extract(headers))
    context = span.get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span, for correlating a log line with its trace."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"
