"""Request/reply on NATS micro services; a caller that gets no usable answer takes no action.

Server side, `serve` decodes each request with `schemas.decode_request` (no `v`: the current
version; an unknown `v`: refused) and answers an error with the micro error headers and a JSON
body `{"error": str, "code": int}`, so a person asking with the `nats` CLI reads why. Client side,
`request` raises only `Unanswered` (no responders, a timeout, not connected, an error reply, an
unreadable reply); the typed clients in `partkeeper.bus.clients` are the way services ask.

A responder answers only a reply subject under the private inbox of one of its node's services
whose role may ask (bus/permissions.py `reply_inboxes`) or under the operators'
`_INBOX.<node token>.admin.`. Anything else, a claim key or a stream subject, would turn the answer
into a write there on the asker's behalf: such a request is dropped, counted
(`partkeeper_requests_dropped_total`) and logged once per endpoint, so a server whose
configuration still had `allow_responses` stays safe.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.request import ERROR_CODE_HEADER, ERROR_HEADER, Request
from nats.micro.service import EndpointConfig, Service
from opentelemetry.trace import SpanKind

from partkeeper.bus.permissions import reply_inboxes
from partkeeper.telemetry import metrics, tracing
from schemas import SchemaError, decode, decode_request, encode

log = logging.getLogger(__name__)
R = TypeVar("R")

BAD_REQUEST = 400
FAILED = 500


class Unanswered(Exception):
    """No usable answer. Callers must treat this as 'do nothing'."""


class NoAnswer(Unanswered):
    """Nobody answered (no responders, a timeout, not connected)."""


class RemoteError(Unanswered):
    """The service answered with an error."""

    def __init__(self, code: str, description: str) -> None:
        super().__init__(f"{code}: {description}")
        self.code = code
        self.description = description


class BadReply(Unanswered):
    """The answer could not be read as the reply the contract names."""


class ErrorBody(msgspec.Struct, frozen=True):
    """The JSON body of every error reply."""

    error: str
    code: int


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
    await nc.flush()  # the server knows the endpoints once this returns
    return service


def _wrap(endpoint: Endpoint) -> Callable[[Request], Awaitable[None]]:
    tracer = tracing.tracer(__name__)
    inboxes = reply_inboxes(endpoint.subject)
    dropped = metrics.REQUESTS_DROPPED.labels(endpoint=endpoint.name)
    logged = False

    async def handle(req: Request) -> None:
        nonlocal logged
        reply_to = req._msg.reply or ""  # nats-py's micro Request exposes no reply subject
        if not any(reply_to.startswith(inbox) and len(reply_to) > len(inbox)
                   for inbox in inboxes):
            dropped.inc()
            if not logged:
                logged = True
                log.warning("%s: dropped a request whose reply subject %r is no inbox that may "
                            "ask (%s); not answering it, nor logging the next ones (counted in "
                            "partkeeper_requests_dropped_total)", endpoint.name, reply_to[:200],
                            ", ".join(f"{p}>" for p in inboxes) or "none")
            return
        with tracing.span_from(
            req.headers, f"serve {endpoint.name}", kind=SpanKind.SERVER, tracer=tracer
        ):
            try:
                body = decode_request(req.data, endpoint.request_type,
                                      what=f"{endpoint.name} request")
            except SchemaError as exc:
                await respond_error(req, BAD_REQUEST, str(exc))
                return
            try:
                reply = await endpoint.handler(body)
            except Exception as exc:
                log.exception("%s failed", endpoint.name)
                await respond_error(req, FAILED, f"{type(exc).__name__}: {exc}")
                return
            await req.respond(encode(reply))

    return handle


async def respond_error(req: Request, code: int, description: str) -> None:
    """The micro error headers and the same in the body, as JSON."""
    body = msgspec.json.encode(ErrorBody(error=description, code=code))
    await req.respond_error(str(code), description, data=body)


async def request(
    nc: Client, subject: str, body: msgspec.Struct, reply_type: type[R], *, timeout: float = 2.0
) -> R:
    """Ask and decode the answer. Raises NoAnswer, RemoteError or BadReply, never guesses."""
    headers = tracing.inject({})
    try:
        msg = await nc.request(subject, encode(body), timeout=timeout, headers=headers)
    except nats.errors.NoRespondersError as exc:
        raise NoAnswer(f"no service answers on {subject}") from exc
    except (nats.errors.TimeoutError, TimeoutError) as exc:
        raise NoAnswer(f"no answer on {subject} within {timeout:g}s") from exc
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
            nats.errors.OutboundBufferLimitError) as exc:
        raise NoAnswer(f"not connected to NATS while asking {subject}") from exc
    except nats.errors.Error as exc:
        raise NoAnswer(f"asking {subject} failed: {exc or type(exc).__name__}") from exc
    if msg.headers and msg.headers.get(ERROR_CODE_HEADER):
        raise RemoteError(msg.headers[ERROR_CODE_HEADER], msg.headers.get(ERROR_HEADER, ""))
    try:
        return decode(msg.data, reply_type, what=f"reply on {subject}")
    except SchemaError as exc:
        raise BadReply(str(exc)) from exc
