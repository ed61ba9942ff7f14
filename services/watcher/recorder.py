"""Kubernetes Events from the partition audit log: a durable consumer of the node's PK_PARTITIONS.

Only the watcher talks to the API server, so what the allocator and the reclaimer record on the
audit log reaches a Pod's Events through here (kube_events.py says which Event each entry
becomes). An Event is advisory:

- it is recorded under a name derived from the fact, and an Event already there counts as
  recorded, so a redelivery or a second publish of the same fact records nothing new;
- a create that fails is retried with backoff for a bounded number of deliveries
  (`Tuning.event_attempts`), then logged and acknowledged: it never holds the stream;
- an entry that names no valid Pod is dead-lettered, one that cannot be decoded too (the
  runner does that); an entry older than `Tuning.event_max_age` is skipped;
- an Event is recorded only on a Pod the watcher's own view holds on this node (a tombstone
  counts: a reclaim ends after its Pod is gone), under the namespace and name the view has, and
  only from an entry on the subject of the service whose kind of entry it is
  (kube_events.scope_of). Anything else is counted `refused` and acknowledged: another service
  of this node cannot make the watcher speak on a Pod of another node, nor the GC for the
  allocator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from nats.js import JetStreamContext
from opentelemetry.trace import Status, StatusCode

from partkeeper import backoff
from partkeeper.bus import ConsumerRunner, Permanent, Retry
from partkeeper.bus.consumer import Delivery
from partkeeper.telemetry import logs, metrics, tracing
from schemas import CardHealthChanged, PartitionEvent, decode
from schemas.names import (
    NODE_SCOPE,
    STREAM_PARTITIONS,
    ConsumerSpec,
    dlq_subject,
    durable_name,
    parts_filter,
)
from services.watcher import node_note
from services.watcher.kube import Kube, KubeError, PodIdentity
from services.watcher.kube_events import (
    BadTarget,
    Note,
    describe,
    event_name,
    named_pod,
    pod_uid_of,
    scope_of,
)
from services.watcher.tuning import Tuning
from services.watcher.view import PodView

SERVICE = "watcher-events"
log = logging.getLogger(__name__)

# Refusals a retry cannot change: bad request, forbidden (e.g. a terminating namespace), a
# namespace that no longer exists, invalid. 408 and 429 ask to come back later.
_FINAL_STATUSES = frozenset({400, 401, 403, 404, 405, 413, 415, 422})


def decode_partition_event(data: bytes) -> PartitionEvent:
    return decode(data, PartitionEvent, what="partition event")


class EventRecorder:
    def __init__(
        self, js: JetStreamContext, kube: Kube, view: PodView, tuning: Tuning, *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.view, self.tuning, self.clock = kube, view, tuning, clock
        node = kube.node
        self.runner: ConsumerRunner[PartitionEvent] = ConsumerRunner(
            js,
            service=SERVICE,
            stream=STREAM_PARTITIONS,
            durable=durable_name(SERVICE, node, STREAM_PARTITIONS),
            filter_subject=parts_filter(node),
            decode=decode_partition_event,
            handle=self.handle,
            dlq_subject=dlq_subject(node, SERVICE),
            # Room beyond our own bound, so only a process dying on every delivery (or a bug
            # raising something unexpected) reaches the runner's dead-letter limit.
            spec=ConsumerSpec(max_deliver=tuning.event_attempts + 2),
            lag_every=tuning.lag_interval,
        )
        self._tracer = tracing.tracer(__name__)

    async def run(self) -> None:
        """Consume until cancelled (the runner reports the consumer's lag)."""
        await self.runner.run()

    async def handle(self, event: PartitionEvent, delivery: Delivery) -> None:
        if isinstance(event, CardHealthChanged):
            await self._card(event, delivery)
            return
        note = describe(event)
        if note is None:
            return
        age = self.clock() - event.at
        if age > self.tuning.event_max_age:
            self._count(note, "stale")
            log.info("no %s Event for an audit entry %.0fs old (kept for %.0fs)", note.reason,
                     age, self.tuning.event_max_age, extra={"pod_uid": pod_uid_of(event)})
            return
        subject_scope = delivery.subject.rsplit(".", 1)[-1]
        if scope_of(event) != subject_scope or event.node != self.kube.node:
            self._count(note, "refused")
            log.warning("no %s Event: a %s about node %s came on %s, which is not its "
                        "publisher's subject", note.reason, type(event).__name__,
                        event.node[:100], delivery.subject,
                        extra={"pod_uid": pod_uid_of(event)})
            return
        pod = await self._target(event)
        if pod is None:
            self._count(note, "unresolved")
            log.warning("no %s Event: Pod %s is not one the watcher's view holds on this node "
                        "under the name the entry gives", note.reason, pod_uid_of(event),
                        extra={"pod_uid": pod_uid_of(event)})
            return
        await self._record(event, note, pod, delivery.attempt)

    async def _card(self, event: CardHealthChanged, delivery: Delivery) -> None:
        """A card's health, noted on this Node: only from the allocator's node-wide subject and
        about this node. A failed patch is retried like an Event, then let go (advice)."""
        if delivery.subject.rsplit(".", 1)[-1] != NODE_SCOPE or event.node != self.kube.node:
            log.warning("no note of card %d's health: it came on %s, not the allocator's "
                        "subject of this node", event.card, delivery.subject)
            return
        try:
            await node_note.note_card(self.kube, node_note.card_note(
                event.card, event.health, event.cause, event.meaning))
        except Exception as exc:
            if delivery.attempt < self.tuning.event_attempts:
                raise Retry(f"noting card {event.card}'s health on the Node: {exc}",
                            delay=backoff.delay(delivery.attempt,
                                                base=self.tuning.event_retry_base,
                                                cap=self.tuning.event_retry_cap)) from exc
            log.warning("card %d's health (%s) not noted on Node %s: %s; it is advice, the "
                        "entry is acknowledged", event.card, event.health, self.kube.node, exc)
            return
        log.info("Node %s notes card %d %s", self.kube.node, event.card, event.health)

    async def _target(self, event: PartitionEvent) -> PodIdentity | None:
        """The Pod as the view holds it on this node (tombstones included); None when the view
        does not, or the entry names it otherwise. The names come from the view, never from
        the entry alone: an entry is what a service of this node says, the view is what the API
        server said."""
        try:
            named = named_pod(event)
        except BadTarget as exc:
            raise Permanent(str(exc)) from exc
        record = await self.view.settled(pod_uid_of(event))
        if record is None or record.node != self.kube.node:
            return None
        if named is not None and (named.namespace, named.name) != (record.namespace,
                                                                   record.name):
            return None
        return record

    async def _record(
        self, event: PartitionEvent, note: Note, pod: PodIdentity, attempt: int
    ) -> None:
        name = event_name(pod.name, note.fact)
        attributes = {"pk.pod_uid": pod.uid, "pk.event": type(event).__name__,
                      "k8s.event.reason": note.reason, "k8s.event.name": name,
                      "pk.claim_id": getattr(event, "claim_id", "")}
        with self._tracer.start_as_current_span(f"watcher Event {note.reason}",
                                                attributes=attributes) as span:
            try:
                created = await self.kube.create_event(
                    pod, note.reason, note.message, note.type, name=name
                )
            except KubeError as exc:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                self._failed(note, pod, name, exc, attempt)
                return
        self._count(note, "created" if created else "exists")
        logs.decision(log, f"Event {note.reason} recorded" if created else
                      f"Event {note.reason} was already recorded", pod_uid=pod.uid,
                      pod=f"{pod.namespace}/{pod.name}", event_name=name,
                      card=getattr(event, "card", None), claim_id=getattr(event, "claim_id", None))

    def _failed(self, note: Note, pod: PodIdentity, name: str, exc: KubeError,
                attempt: int) -> None:
        """Raise Retry while a later delivery may succeed; else log and let the entry go."""
        final = exc.status in _FINAL_STATUSES
        if not final and attempt < self.tuning.event_attempts:
            delay = backoff.delay(attempt, base=self.tuning.event_retry_base,
                                  cap=self.tuning.event_retry_cap)
            log.info("Event %s on Pod %s not recorded yet (%s); delivery %d of %d, next in "
                     "%.1fs", note.reason, pod.uid, exc, attempt, self.tuning.event_attempts,
                     delay, extra={"pod_uid": pod.uid, "event_name": name})
            raise Retry(f"Event {note.reason} on Pod {pod.uid}: {exc}", delay=delay)
        self._count(note, "failed")
        why = "the API server refuses it" if final else f"gave up after {attempt} attempts"
        log.warning("Event %s on Pod %s/%s (%s) not recorded, %s: %s; it is advisory, the audit "
                    "entry is acknowledged", note.reason, pod.namespace, pod.name, pod.uid, why,
                    exc, extra={"pod_uid": pod.uid, "event_name": name})

    @staticmethod
    def _count(note: Note, result: str) -> None:
        metrics.KUBE_EVENTS.labels(reason=note.reason, result=result).inc()
