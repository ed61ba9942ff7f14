"""The grpc.aio server interceptor: one SERVER span per RPC, continuing the caller's trace, over a
real gRPC server and client on a unix socket (the device-plugin API the allocator serves)."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from partkeeper.kubelet import deviceplugin_pb2 as pb
from partkeeper.kubelet import deviceplugin_pb2_grpc as pb_grpc
from partkeeper.telemetry.grpc import ServerTracing, carrier_of, outgoing_metadata
from tests_support import until

ALLOCATE = "v1beta1.DevicePlugin/Allocate"


class Plugin(pb_grpc.DevicePluginServicer):
    """Allocate opens a span of its own; device id "refuse" aborts, "crash" raises."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("plugin")

    async def Allocate(
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        ids = [i for r in request.container_requests for i in r.devices_ids]
        with self.tracer.start_as_current_span("claim"):
            if "refuse" in ids:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no 1g.10gb room")
            if "crash" in ids:
                raise RuntimeError("driver exploded")
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse()])

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        for health in ("Healthy", "Unhealthy"):
            yield pb.ListAndWatchResponse(devices=[pb.Device(ID="t0", health=health)])


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
async def stub(spans: tuple[TracerProvider, InMemorySpanExporter]) -> AsyncIterator[
    pb_grpc.DevicePluginStub
]:
    provider, _ = spans
    with tempfile.TemporaryDirectory(prefix="pk-grpc-") as workdir:
        socket = Path(workdir) / "plugin.sock"
        server = grpc.aio.server(interceptors=[ServerTracing(tracer_provider=provider)])
        pb_grpc.add_DevicePluginServicer_to_server(Plugin(provider), server)
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                yield pb_grpc.DevicePluginStub(channel)
        finally:
            await server.stop(grace=None)


def allocate(*ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])


async def named(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    """The one finished span called `name`. The server's span ends after the status has gone to
    the client (an abort answers first, then unwinds the handler), so the test waits for it."""
    def found() -> list[ReadableSpan]:
        return [s for s in exporter.get_finished_spans() if s.name == name]

    await until(found, f"the span {name} ended")
    (span,) = found()
    return span


async def test_an_rpc_without_a_caller_context_starts_a_trace_its_handler_continues(
    stub: pb_grpc.DevicePluginStub, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    _, exporter = spans
    await stub.Allocate(allocate("t0"), timeout=10)
    server, inner = await named(exporter, ALLOCATE), await named(exporter, "claim")
    assert server.kind is SpanKind.SERVER and server.parent is None
    assert dict(server.attributes or {}) == {
        "rpc.system": "grpc", "rpc.service": "v1beta1.DevicePlugin", "rpc.method": "Allocate",
        "rpc.grpc.status_code": 0,
    }
    assert server.status.status_code is StatusCode.UNSET
    assert inner.parent is not None and inner.parent.span_id == server.context.span_id
    assert inner.context.trace_id == server.context.trace_id


async def test_the_callers_traceparent_is_continued(
    stub: pb_grpc.DevicePluginStub, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    with provider.get_tracer("kubelet").start_as_current_span("admit") as caller:
        await stub.Allocate(allocate("t0"), metadata=outgoing_metadata([("x-a", "b")]),
                            timeout=10)
    server = await named(exporter, ALLOCATE)
    assert server.context.trace_id == caller.get_span_context().trace_id
    assert server.parent is not None
    assert server.parent.span_id == caller.get_span_context().span_id
    assert server.parent.is_remote


@pytest.mark.parametrize(("device", "code", "fragment"), [
    ("refuse", grpc.StatusCode.RESOURCE_EXHAUSTED, "no 1g.10gb room"),
    ("crash", grpc.StatusCode.UNKNOWN, "driver exploded"),
])
async def test_a_failed_rpc_marks_its_span_an_error_with_the_code(
    stub: pb_grpc.DevicePluginStub, spans: tuple[TracerProvider, InMemorySpanExporter],
    device: str, code: grpc.StatusCode, fragment: str,
) -> None:
    _, exporter = spans
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await stub.Allocate(allocate(device), timeout=10)
    assert failed.value.code() is code
    server = await named(exporter, ALLOCATE)
    assert (server.attributes or {})["rpc.grpc.status_code"] == code.value[0]
    assert server.status.status_code is StatusCode.ERROR
    assert fragment in (server.status.description or "")
    parent = (await named(exporter, "claim")).parent
    assert parent is not None and parent.span_id == server.context.span_id


async def test_a_server_stream_is_one_span_lasting_the_stream(
    stub: pb_grpc.DevicePluginStub, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    _, exporter = spans
    received = [r async for r in stub.ListAndWatch(pb.Empty(), timeout=10)]
    assert [r.devices[0].health for r in received] == ["Healthy", "Unhealthy"]
    server = await named(exporter, "v1beta1.DevicePlugin/ListAndWatch")
    assert server.kind is SpanKind.SERVER
    assert (server.attributes or {})["rpc.grpc.status_code"] == 0


def test_metadata_becomes_a_carrier() -> None:
    carrier = carrier_of([("Traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
                          ("blob-bin", b"\x00"), ("x", "y")])
    assert carrier == {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "x": "y"}
    assert carrier_of(None) == {}
