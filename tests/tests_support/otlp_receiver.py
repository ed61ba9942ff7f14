"""An OTLP trace receiver for tests: a real gRPC server implementing
`opentelemetry.proto.collector.trace.v1.TraceService/Export` on a free loopback port.

    async with OtlpReceiver() as receiver:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint   # http://127.0.0.1:<port>
        ...
        span = await receiver.wait_for_span(lambda s: s.name == "watcher PodGone")

It keeps every span it is sent, in arrival order, with the `service.name` of the resource that
sent it, and lets a test wait for a condition with a deadline: on one span (`wait_for_span`) or
on everything received (`wait_until`, e.g. a whole trace arrived and is connected: `orphans`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import grpc.aio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    trace_id: str  # 32 hex
    span_id: str  # 16 hex
    parent_id: str | None  # 16 hex, None for a root span
    name: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0  # Status.StatusCode: 0 unset, 1 ok, 2 error


def value_of(value: AnyValue) -> Any:
    """An OTLP attribute value as a plain Python value."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [value_of(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, which)


def attributes_of(pairs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> OtlpReceiver:
        server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, server)
        self.port = server.add_insecure_port(f"{self.host}:0")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def __aenter__(self) -> OtlpReceiver:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.aio.ServicerContext,
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = attributes_of(resource_spans.resource.attributes)
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                received.extend(_span(span, service) for span in scope_spans.spans)
        async with self._changed:
            self.spans.extend(received)
            self.requests += 1
            self._changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def find(self, predicate: Callable[[ReceivedSpan], bool]) -> list[ReceivedSpan]:
        return [s for s in self.spans if predicate(s)]

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """Every span received so far of one trace, in arrival order."""
        return [s for s in self.spans if s.trace_id == trace_id]

    async def wait_until(
        self, condition: Callable[[], T | None], timeout: float = 15.0, what: str = ""
    ) -> T:
        """What `condition` returns once it is not None, re-evaluated on every export, failing
        at the deadline with what was received."""
        found: list[T] = []

        def ready() -> bool:
            value = condition()
            if value is not None:
                found[:] = [value]
            return bool(found)

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout)
            except TimeoutError:
                names = sorted({(s.service, s.name) for s in self.spans})
                raise AssertionError(
                    f"{what or 'condition'} not met within {timeout}s; received: {names}"
                ) from None
        return found[0]

    async def wait_for_span(
        self, predicate: Callable[[ReceivedSpan], bool], timeout: float = 15.0
    ) -> ReceivedSpan:
        """The first span matching `predicate`, waiting for it until the deadline."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.find(predicate)), timeout
                )
            except TimeoutError:
                names = sorted({(s.service, s.name) for s in self.spans})
                raise AssertionError(
                    f"no matching span within {timeout}s; received: {names}"
                ) from None
            return self.find(predicate)[0]


def orphans(spans: Sequence[ReceivedSpan]) -> list[ReceivedSpan]:
    """The spans whose parent is not among `spans`, roots included: exactly one (the root) when
    the spans make one connected tree."""
    ids = {s.span_id for s in spans}
    return [s for s in spans if s.parent_id is None or s.parent_id not in ids]


def ancestry(span: ReceivedSpan, spans: Sequence[ReceivedSpan]) -> list[ReceivedSpan]:
    """`span`, its parent, its parent's parent... as far as `spans` hold them."""
    by_id = {s.span_id: s for s in spans}
    chain = [span]
    while chain[-1].parent_id in by_id and len(chain) <= len(spans):
        chain.append(by_id[chain[-1].parent_id])
    return chain


def _span(span: Any, service: str) -> ReceivedSpan:
    return ReceivedSpan(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex() or None,
        name=span.name,
        kind=int(span.kind),
        service=service,
        attributes=attributes_of(span.attributes),
        status_code=int(span.status.code),
    )
