"""Tracing of gRPC calls: a grpc.aio server interceptor opening one SERVER span per RPC.

Install it on a server: `grpc.aio.server(interceptors=[ServerTracing()])`. Each RPC gets a span
named after its method (`v1beta1.DevicePlugin/Allocate`), continuing the trace named by the
incoming metadata's `traceparent` when the caller sent one (kubelet does not; the simulated
kubelet and tests may), so every span the handler opens is its child. The span lasts as long
as the RPC: for a server-streaming call such as ListAndWatch, until the stream ends.

A caller that wants its trace continued sends `outgoing_metadata()` with the call.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import grpc.aio
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from partkeeper.telemetry.tracing import extract

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]
# How a handler ends when the caller goes away: its task is cancelled, or its stream closed.
_ENDED = (asyncio.CancelledError, GeneratorExit)


class ServerTracing(grpc.aio.ServerInterceptor):
    """One SERVER span per RPC. `tracer_provider` defaults to the process's (tracing.setup)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = str(handler_call_details.method or "")
        carrier = carrier_of(handler_call_details.invocation_metadata)
        return _traced(handler, _Call(self._tracer, method, carrier))


def outgoing_metadata(extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """Call metadata carrying the current span's `traceparent`, after the `extra` entries."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [*extra, *carrier.items()]


def carrier_of(metadata: Iterable[Any] | None) -> dict[str, str]:
    """The text entries of gRPC metadata as a header map; keys are lowercase on the wire, and
    binary (`-bin`) entries cannot carry a W3C context."""
    carrier: dict[str, str] = {}
    for entry in metadata or ():
        key, value = entry[0], entry[1]
        if isinstance(key, str) and isinstance(value, str):
            carrier[key.lower()] = value
    return carrier


class _Call:
    """What the span of one RPC needs: the tracer, the method and the caller's context."""

    def __init__(self, tracer: trace.Tracer, method: str, carrier: dict[str, str]) -> None:
        self.tracer = tracer
        self.method = method
        self.carrier = carrier

    @contextmanager
    def span(self, context: grpc.aio.ServicerContext) -> Iterator[trace.Span]:
        name = self.method.lstrip("/") or "grpc"
        service, _, rpc_method = name.rpartition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc_method}
        with self.tracer.start_as_current_span(
            name, context=extract(self.carrier), kind=SpanKind.SERVER, attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                _finish(span, context, exc)
                raise
            _finish(span, context, None)


def _finish(span: trace.Span, context: grpc.aio.ServicerContext, exc: BaseException | None) -> None:
    """Record how the RPC ended. Any code but OK marks the span an error, so a refused
    Allocate is what a search for errors finds."""
    code = _code_of(context, exc)
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is grpc.StatusCode.OK:
        return
    if exc is not None and not isinstance(exc, (grpc.aio.AbortError, *_ENDED)):
        span.record_exception(exc)
    details = _details_of(context) or (f"{type(exc).__name__}: {exc}" if exc else code.name)
    span.set_status(Status(StatusCode.ERROR, details))


def _code_of(context: grpc.aio.ServicerContext, exc: BaseException | None) -> grpc.StatusCode:
    code = _safe(context.code)
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(exc, _ENDED):
        return grpc.StatusCode.CANCELLED
    if exc is not None:
        return grpc.StatusCode.UNKNOWN  # what grpc answers for an unhandled exception
    return grpc.StatusCode.OK


def _details_of(context: grpc.aio.ServicerContext) -> str:
    details = _safe(context.details)
    if isinstance(details, bytes):
        return details.decode("utf-8", "replace")
    return details if isinstance(details, str) else ""


def _safe(getter: Callable[[], Any]) -> Any:
    # A context whose RPC already ended may refuse to answer; the span must not fail the call.
    try:
        return getter()
    except Exception:
        return None


def _traced(handler: grpc.RpcMethodHandler, call: _Call) -> grpc.RpcMethodHandler:
    options = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_wrap(handler.unary_unary, call), **options)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_wrap(handler.unary_stream, call), **options)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_wrap(handler.stream_unary, call), **options)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(
            _wrap(handler.stream_stream, call), **options
        )
    return handler


def _wrap(behavior: Behavior, call: _Call) -> Behavior:
    """The same kind of callable grpc.aio expects back: a coroutine function, or an async
    generator function when the handler yields its responses."""
    if inspect.isasyncgenfunction(behavior):

        async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with call.span(context):
                async for response in behavior(request, context):
                    yield response

        return streamed

    async def awaited(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with call.span(context):
            return await behavior(request, context)

    return awaited
