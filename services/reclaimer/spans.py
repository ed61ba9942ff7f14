"""The spans of a job's steps (release, destroy, remove) and the trace a job belongs to.

A job runs in its own task, so its steps are parented by the context the job holds: the caller
that started it (the Pod-event consumer, `reclaim.now`), or the first caller with a trace that
joins a job started without one (the reconcile pass has no span: a Pod event arriving while the
pass already drives its claim still gets the destroy in its trace).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from partkeeper.drivers.base import Instance
from partkeeper.telemetry import tracing
from schemas import Claim

_tracer = tracing.tracer(__name__)


def traced(context: otel_context.Context) -> bool:
    """Whether `context` holds a span, i.e. belongs to some trace."""
    return trace.get_current_span(context).get_span_context().is_valid


@contextmanager
def step(name: str, claim: Claim, instance: Instance | None = None) -> Iterator[trace.Span]:
    """A span for one step of the job of `claim`; what is published inside carries it on."""
    attributes: dict[str, str | int] = {
        "pk.pod_uid": claim.pod_uid, "pk.card": claim.card, "pk.profile": claim.profile,
        "pk.claim_id": claim.id, "pk.claim_kind": claim.kind,
    }
    uuid = instance.uuid if instance else (claim.instance.uuid if claim.instance else None)
    if uuid:
        attributes["pk.instance_uuid"] = uuid
    with _tracer.start_as_current_span(name, attributes=attributes) as span:
        yield span


def failed(span: trace.Span, kind: str, message: str) -> None:
    """Mark a step failed with the driver's error kind, so a search for errors finds it."""
    span.set_attribute("pk.driver_error", kind)
    span.set_status(Status(StatusCode.ERROR, message))
