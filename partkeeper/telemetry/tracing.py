"""OpenTelemetry tracing: setup from the standard OTEL_* variables, and W3C context in headers."""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

_configured = False


def setup(service: str) -> None:
    """Install a tracer provider exporting over OTLP when an endpoint is configured.

    Without OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_TRACES_EXPORTER=otlp) spans are still created and
    propagated, so trace ids travel across services, but nothing is exported.
    """
    global _configured
    if _configured:
        return
    _configured = True
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or f"partkeeper-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    wants_otlp = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if wants_otlp and os.environ.get("OTEL_TRACES_EXPORTER", "otlp") != "none":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def shutdown() -> None:
    provider = trace.get_tracer_provider()
    flush = getattr(provider, "shutdown", None)
    if flush is not None:
        flush()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add `traceparent` (and `tracestate`) of the current span to `headers`."""
    propagate.inject(headers)
    return headers


def extract(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The context carried by `headers`, to parent the spans of a handler."""
    return propagate.extract(dict(headers or {}))
