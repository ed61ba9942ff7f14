"""What tracing.setup reads from the standard OTEL_* variables, and header helpers."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from partkeeper.telemetry import tracing
from partkeeper.telemetry.tracing import OtlpTarget, exporters, otlp_target

EP = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_EP = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"


@pytest.mark.parametrize(("env", "expected"), [
    ({}, ()),
    ({EP: "http://jaeger:4317"}, ("otlp",)),
    ({TRACES_EP: "http://jaeger:4317"}, ("otlp",)),
    ({EP: "  "}, ()),
    ({EP: "http://jaeger:4317", "OTEL_TRACES_EXPORTER": "none"}, ()),
    ({EP: "http://jaeger:4317", "OTEL_TRACES_EXPORTER": "otlp,none"}, ()),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
    ({"OTEL_TRACES_EXPORTER": " Console , otlp,console"}, ("console", "otlp")),
    ({EP: "http://jaeger:4317", "OTEL_SDK_DISABLED": "true"}, ()),
], ids=["nothing", "endpoint", "traces-endpoint", "blank", "none", "none-wins", "explicit",
        "list", "disabled"])
def test_which_exporters(env: dict[str, str], expected: tuple[str, ...]) -> None:
    assert exporters(env) == expected


@pytest.mark.parametrize(("env", "expected"), [
    ({}, OtlpTarget("http://localhost:4317", True)),
    ({EP: "http://127.0.0.1:4317"}, OtlpTarget("http://127.0.0.1:4317", True)),
    ({EP: "https://collector:4317"}, OtlpTarget("https://collector:4317", False)),
    ({EP: "https://collector:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
     OtlpTarget("https://collector:4317", False)),
    ({EP: "collector:4317"}, OtlpTarget("collector:4317", False)),
    ({EP: "collector:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
     OtlpTarget("collector:4317", True)),
    ({EP: "http://a:4317", "OTEL_EXPORTER_OTLP_INSECURE": "false"},
     OtlpTarget("http://a:4317", False)),
    ({EP: "http://a:4317", TRACES_EP: "http://b:4317",
      "OTEL_EXPORTER_OTLP_INSECURE": "false", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "TRUE"},
     OtlpTarget("http://b:4317", True)),
], ids=["default", "http", "https", "https-stays-tls", "no-scheme", "no-scheme-insecure",
        "http-but-secure", "traces-variables-win"])
def test_where_otlp_goes(env: dict[str, str], expected: OtlpTarget) -> None:
    assert otlp_target(env) == expected


def test_a_span_from_headers_continues_their_trace() -> None:
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("publisher") as publisher:
        headers = tracing.inject({"Nats-Msg-Id": "x"})
    assert tracing.trace_id_of(headers) == f"{publisher.get_span_context().trace_id:032x}"
    with tracing.span_from(headers, "consume", tracer=tracer,
                           attributes={"a": 1}) as consumer:
        assert tracing.current_ids() == (
            f"{consumer.get_span_context().trace_id:032x}",
            f"{consumer.get_span_context().span_id:016x}",
        )
    assert consumer.get_span_context().trace_id == publisher.get_span_context().trace_id
    assert consumer.parent is not None  # type: ignore[attr-defined]  # the SDK's ReadableSpan behind the API Span type
    assert consumer.parent.span_id == publisher.get_span_context().span_id  # type: ignore[attr-defined]  # the SDK's ReadableSpan behind the API Span type
    assert consumer.kind is SpanKind.CONSUMER  # type: ignore[attr-defined]  # the SDK's ReadableSpan behind the API Span type
    assert tracing.trace_id_of({}) is None
    assert tracing.trace_id_of({"traceparent": "garbage"}) is None
