"""Putting the capacity update that follows a reclaim into the reclaim's trace.

The recompute is woken by a KV watch of the claims, and KV entries carry no trace context. The
audit entry of a removal does: the reclaimer publishes `ClaimChanged(removed)` inside its
`remove` span. So the allocator follows the node's `PK_PARTITIONS` subjects, and for each removal
opens a `capacity update` span continuing the entry's `traceparent`, wakes the recompute (the
same coalescing wake-up as every other trigger: no data, the pass reads fresh state) and ends the
span once a pass that read after the wake-up has pushed ListAndWatch, or after REFRESH_SECONDS.

The consumer is an ordered (ephemeral) one starting at new messages (bus/ordered.py, created on
the node's subjects only, resuming after the last entry seen when it is reset): the span is
advisory, so a removal published while the allocator is down costs a span, never capacity (the
KV watch and the start-up pass still see it); a durable consumer would instead replay old
removals after a restart and open spans long after their reclaim. Nothing here waits inside the
recompute.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.msg import Msg
from nats.js import api
from opentelemetry.trace import SpanKind, Status, StatusCode

from partkeeper import backoff
from partkeeper.bus.ordered import OrderedWatch
from partkeeper.telemetry import tracing
from schemas import ClaimChanged, PartitionEvent, SchemaError, decode
from schemas.names import STREAM_PARTITIONS, parts_filter
from services.allocator.core.recompute import Recompute
from services.allocator.core.state import Context

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)

REFRESH_SECONDS = 2.0  # a pass takes milliseconds; beyond this the span says it timed out
MAX_OPEN = 256  # spans waiting at once; a burst beyond this goes untraced, never queued


class Removals:
    def __init__(self, ctx: Context, recompute: Recompute) -> None:
        self.ctx = ctx
        self.recompute = recompute
        self.open: set[asyncio.Task[None]] = set()
        self.skipped = 0

    async def run(self) -> None:
        """Follow the node's partition subjects until cancelled; resubscribe after a failure."""
        try:
            await backoff.keep_following(f"following {STREAM_PARTITIONS}", self._follow)
        finally:
            for task in self.open:
                task.cancel()
            await asyncio.gather(*self.open, return_exceptions=True)

    async def _follow(self) -> None:
        async with OrderedWatch(self.ctx.nc, STREAM_PARTITIONS, parts_filter(self.ctx.node),
                                deliver=api.DeliverPolicy.NEW, label="allocator-parts") as watch:
            async for msg in watch:
                if msg is not None:  # None: the (empty) replay of a start at new messages
                    self.on_message(msg)

    def on_message(self, msg: Msg) -> None:
        try:
            event = decode(msg.data, PartitionEvent, what="partition event")
        except SchemaError as exc:
            log.debug("partition entry not readable here (%s); no span", exc)
            return
        if not isinstance(event, ClaimChanged) or event.state != "removed":
            return
        if len(self.open) >= MAX_OPEN:
            self.skipped += 1
            return
        task = asyncio.create_task(self.traced(event, dict(msg.headers or {})),
                                   name=f"capacity update {event.claim_id}")
        self.open.add(task)
        task.add_done_callback(self.open.discard)

    async def traced(self, event: ClaimChanged, headers: dict[str, str]) -> None:
        attributes = {"pk.pod_uid": event.pod_uid, "pk.card": event.card,
                      "pk.profile": event.profile, "pk.claim_id": event.claim_id,
                      "messaging.destination": STREAM_PARTITIONS}
        if event.instance_uuid:
            attributes["pk.instance_uuid"] = event.instance_uuid
        with tracing.span_from(headers, "capacity update", kind=SpanKind.CONSUMER,
                               attributes=attributes, tracer=_tracer) as span:
            pushed = await self.recompute.refresh(REFRESH_SECONDS)
            span.set_attribute("pk.recompute_pass", self.recompute.pushed)
            if not pushed:
                span.set_status(Status(StatusCode.ERROR, f"no recompute pushed the lists within "
                                                         f"{REFRESH_SECONDS:g}s"))
                return
            free = self._free(event.profile)
            if free is not None:
                span.set_attribute("pk.free_placements", free)

    def _free(self, profile: str) -> int | None:
        """Placements of `profile` free in the capacity the pass published, when it says."""
        published = self.recompute.published
        if published is None:
            return None
        for resource, offer in self.ctx.offers.items():
            if offer.profile == profile and resource in published.resources:
                return int(published.resources[resource].free)
        return None
