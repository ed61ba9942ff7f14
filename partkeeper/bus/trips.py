"""Counting a connection's bus round trips, by kind and by the trace they were made in.

Every exchange a service has with NATS goes through two methods of its `Client`: `request`
(service requests, and under the client's JetStream and KV layers every JetStream publish, KV
get, put, create and update, stream info and consumer fetch) and `publish` (acks, replies, core
publishes). `count(nc)` wraps those two on one connection and records each call with its kind, its
subject, its duration and the trace id current when it was made, so a test can take the trips of
one operation (an Allocate, a prepare, a PodGone handled) by the trace id it sent with it, and a
benchmark can show where an operation's time went. Nothing else of the client is touched, and a
connection not passed to `count` is unchanged.
"""

from __future__ import annotations

import contextvars
import secrets
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from opentelemetry import trace

KV_PREFIX = "$KV."
EXPECTED_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"  # KV create and update (the CAS)

# Set while a counted request runs: the client's `request` publishes through `publish`, and that
# half of the trip is not a second one.
_in_request: contextvars.ContextVar[bool] = contextvars.ContextVar("in_request", default=False)


@dataclass(frozen=True, slots=True)
class Trip:
    kind: str  # see `kind_of`
    subject: str
    seconds: float
    trace_id: str | None
    started: float  # time.perf_counter() when it was made


@dataclass
class Trips:
    """Every trip made on one counted connection, in order."""

    made: list[Trip] = field(default_factory=list)

    def of_trace(self, trace_id: str) -> list[Trip]:
        return [t for t in self.made if t.trace_id == trace_id]

    def clear(self) -> None:
        self.made.clear()


def new_trace() -> tuple[str, tuple[tuple[str, str], ...]]:
    """A fresh trace id, and gRPC metadata carrying it (W3C `traceparent`, sampled), for an
    operation whose trips are to be told apart from everything else on the connection."""
    trace_id = secrets.token_hex(16)
    return trace_id, (("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),)


def kinds(trips: Iterable[Trip]) -> dict[str, int]:
    """How many trips of each kind: the figure the round-trip tests assert."""
    return dict(sorted(Counter(t.kind for t in trips).items()))


def kind_of(subject: str, headers: dict[str, str] | None, *, reply: bool) -> str:
    """What a trip is, from its subject and headers alone (the protocol's layout, not the
    client's internals): `$KV.<bucket>.<key>` is a KV write, a CAS when it carries the expected
    subject sequence; `$JS.API.DIRECT.GET` and `STREAM.MSG.GET` are reads; any other request
    carrying `Nats-Msg-Id` is a JetStream publish (partkeeper's `publish` always sets it)."""
    if subject.startswith("$JS.ACK."):
        return "ack"  # a plain ack, or one the server confirms (`ack_sync`)
    if not reply:
        return "core publish"
    if subject.startswith(KV_PREFIX):
        bucket = subject.split(".", 2)[1]
        cas = headers is not None and EXPECTED_SEQUENCE in headers
        return f"kv {'cas' if cas else 'write'} {bucket}"
    if subject.startswith(("$JS.API.DIRECT.GET.", "$JS.API.STREAM.MSG.GET.")):
        stream = subject.split(".")[4 if subject.startswith("$JS.API.DIRECT.") else 5]
        return f"kv read {stream.removeprefix('KV_')}" if stream.startswith("KV_") else \
            f"stream read {stream}"
    if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
        return "consumer fetch"
    if subject.startswith("$JS.API."):
        return "jetstream api " + ".".join(subject.split(".")[2:4])
    # partkeeper's subjects name the node (docs/contract.md): the kind keeps what names the
    # stream (`pk.parts`) or the endpoint (`pods.pending`), not the node.
    tokens = subject.split(".")
    if headers is not None and "Nats-Msg-Id" in headers:
        return "publish " + ".".join(tokens[:2])
    return "request " + ".".join(tokens[-2:])


def _trace_id() -> str | None:
    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None


def count(nc: Client) -> Trips:
    """Record every request and publish made on `nc` from now on."""
    trips = Trips()
    request, publish = nc.request, nc.publish

    async def counted_request(subject: str, payload: bytes = b"", timeout: float = 0.5,
                              old_style: bool = False, headers: dict[str, str] | None = None
                              ) -> Any:
        started = time.perf_counter()
        inside = _in_request.set(True)
        try:
            return await request(subject, payload, timeout=timeout, old_style=old_style,
                                 headers=headers)
        finally:
            _in_request.reset(inside)
            trips.made.append(Trip(kind_of(subject, headers, reply=True), subject,
                                   time.perf_counter() - started, _trace_id(), started))

    async def counted_publish(subject: str, payload: bytes = b"", reply: str = "",
                              headers: dict[str, str] | None = None) -> None:
        if _in_request.get():
            return await publish(subject, payload, reply=reply, headers=headers)
        started = time.perf_counter()
        try:
            await publish(subject, payload, reply=reply, headers=headers)
        finally:
            # A publish with a reply subject is the client's own half of a JetStream publish
            # made without waiting (`publish_async`): a round trip all the same.
            trips.made.append(Trip(kind_of(subject, headers, reply=bool(reply)), subject,
                                   time.perf_counter() - started, _trace_id(), started))

    nc.request = counted_request  # type: ignore[method-assign]
    nc.publish = counted_publish  # type: ignore[method-assign]
    return trips
