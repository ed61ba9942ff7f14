"""Request/reply on NATS micro services; a caller that gets no answer takes no action."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import EndpointConfig, Service
from opentelemetry.trace import SpanKind

from partkeeper.telemetry import tracing
from schemas import SchemaError, decode, encode

log = logging.getLogger(__name__)
R = TypeVar("R")

ERROR_CODE_HEADER = "Nats-Service-Error-Code"
ERROR_HEADER = "Nats-Service-Error"


class NoAnswer(Exception):
    """Nobody answered (no responders, or a timeout). Callers must treat this as 'do nothing'."""


class RemoteError(Exception):
    """The service answered with an error."""

    def __init__(self, code: str, description: str) -> None:
        super().__init__(f"{code}: {description}")
        self.code = code
        self.description = description


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    subject: str
    request_type: Any
    handler: Callable[[Any], Awaitable[msgspec.Struct]]


async def serve(
    nc: Client, *, name: str, version: str, description: str, endpoints: list[Endpoint]
) -> Service:
    """Start a micro service; each endpoint decodes strictly and answers with a contract struct."""
    service = await add_service(nc, name=name, version=version, description=description)
    for endpoint in endpoints:
        await service.add_endpoint(
            EndpointConfig(
                name=endpoint.name, subject=endpoint.subject, handler=_wrap(endpoint)
            )
        )
    return service


def _wrap(endpoint: Endpoint) -> Callable[[Request], Awaitable[None]]:
    tracer = tracing.tracer(__name__)

    async def handle(req: Request) -> None:
        with tracing.span_from(
            req.headers, f"serve {endpoint.name}", kind=SpanKind.SERVER, tracer=tracer
        ):
            try:
                body = decode(req.data, endpoint.request_type, what=f"{endpoint.name} request")
            except SchemaError as exc:
                await req.respond_error("400", str(exc))
                return
            try:
                reply = await endpoint.handler(body)
            except Exception as exc:
                log.exception("%s failed", endpoint.name)
                await req.respond_error("500", f"{type(exc).__name__}: {exc}")
                return
            await req.respond(encode(reply))

    return handle


async def request(
    nc: Client, subject: str, body: msgspec.Struct, reply_type: type[R], *, timeout: float = 2.0
) -> R:
    """Ask and decode the answer. Raises NoAnswer, RemoteError or SchemaError, never guesses."""
    headers = tracing.inject({})
    try:
        msg = await nc.request(subject, encode(body), timeout=timeout, headers=headers)
    except nats.errors.NoRespondersError as exc:
        raise NoAnswer(f"no service answers on {subject}") from exc
    except (nats.errors.TimeoutError, TimeoutError) as exc:
        raise NoAnswer(f"no answer on {subject} within {timeout:g}s") from exc
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError) as exc:
        raise NoAnswer(f"not connected to NATS while asking {subject}") from exc
    if msg.headers and msg.headers.get(ERROR_CODE_HEADER):
        raise RemoteError(msg.headers[ERROR_CODE_HEADER], msg.headers.get(ERROR_HEADER, ""))
    return decode(msg.data, reply_type, what=f"reply on {subject}")
