"""The watcher's view of the node's Pods: in memory, persisted in the `pk-pods` KV bucket.

`apply(observation)` is the one writer: decide (pure), publish the event, then write the record
with compare-and-set. Publishing first means a crash in between re-publishes (dropped as a
duplicate by its msg id) rather than forgets. Observations are applied one at a time (a lock), so
the watch loop and the queries never interleave their writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from opentelemetry.trace import SpanKind

from partkeeper import faults
from partkeeper.bus import publish
from partkeeper.bus.kv import Bucket, entries
from partkeeper.lifecycle import honour_cancel
from partkeeper.telemetry import logs, metrics, tracing
from schemas import PodRecord, SchemaError, decode, encode
from schemas.names import (
    BUCKET_PODS,
    DAY,
    TokenError,
    decode_token,
    encode_token,
    pods_key,
    pods_subject,
)
from services.watcher.decide import Decision, Observation, decide, msg_id, observation_uid
from services.watcher.pods import parse_rv

log = logging.getLogger(__name__)
MAX_CONFLICTS = 8


class ViewError(Exception):
    """The view could not be read or an effect could not be made durable (NATS trouble)."""


@dataclass(frozen=True, slots=True)
class Stored:
    record: PodRecord | None  # None: the key exists but could not be read
    revision: int


class PodView:
    def __init__(
        self, js: JetStreamContext, kv: KeyValue, node: str, *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.js, self.kv, self.node, self.clock = js, kv, node, clock
        self.bucket = Bucket(js, BUCKET_PODS, kv)
        self._stored: dict[str, Stored] = {}
        self._lock = asyncio.Lock()
        self._tracer = tracing.tracer(__name__)
        self.resource_version = ""  # the newest API resourceVersion the view has caught up to

    async def load(self) -> int:
        """Read every record of this node; raises ViewError (fail closed) when the read fails."""
        prefix = f"{encode_token(self.node)}."
        try:
            found = await entries(self.bucket, f"{prefix}*")
        except Exception as exc:
            raise ViewError(f"reading the pk-pods view of node {self.node} failed: {exc}") from exc
        honour_cancel()
        self._stored = {}
        for key, entry in found.items():
            try:
                uid = decode_token(key[len(prefix):])
            except TokenError as exc:
                log.error("pk-pods key %s is not <node>.<uid>: %s; ignored", key, exc)
                continue
            record = self._decode(key, uid, entry.value)
            self._stored[uid] = Stored(record, int(entry.revision or 0))
        return len(self._stored)

    def _decode(self, key: str, uid: str, value: bytes | None) -> PodRecord | None:
        try:
            record = decode(value or b"", PodRecord, what=f"pod record {key}")
        except SchemaError as exc:
            log.error("unreadable Pod record %s: %s; Pod %s is treated as never seen, and the "
                      "record will be overwritten when the Pod is observed", key, exc, uid,
                      extra={"pod_uid": uid})
            return None
        if record.uid != uid or record.node != self.node:
            log.error("Pod record %s names node %s uid %s; ignored", key, record.node, record.uid,
                      extra={"pod_uid": uid})
            return None
        return record

    def get(self, uid: str) -> PodRecord | None:
        stored = self._stored.get(uid)
        return stored.record if stored else None

    async def settled(self, uid: str) -> PodRecord | None:
        """The record once no observation is half applied: an event already published is
        reflected, so a consumer that saw an event and then asks is never answered older."""
        async with self._lock:
            return self.get(uid)

    async def settled_records(self) -> list[PodRecord]:
        async with self._lock:
            return self.records()

    def records(self) -> list[PodRecord]:
        return [s.record for s in self._stored.values() if s.record is not None]

    def caught_up(self, resource_version: str) -> None:
        """Note a resourceVersion applied (a LIST's, a watch event's, a bookmark's); the view's
        version only moves forward, whoever (the watch, a query's LIST) got there first."""
        try:
            behind = parse_rv(resource_version) <= parse_rv(self.resource_version)
        except ValueError:
            behind = False
        if not behind:
            self.resource_version = resource_version

    async def apply(self, observation: Observation) -> Decision:
        """Decide, publish, persist. Raises ViewError when NATS cannot take the effect."""
        uid = observation_uid(observation)
        async with self._lock:
            for _ in range(MAX_CONFLICTS):
                stored = self._stored.get(uid)
                current = stored.record if stored else None
                decision = decide(self.node, current, observation, self.clock())
                if decision.record is None:
                    return decision
                committed = await self._commit(uid, decision, stored.revision if stored else 0)
                honour_cancel()
                if committed:
                    _log_decision(decision)
                    return decision
                await self._reload(uid)
        raise ViewError(f"Pod {uid}: the record kept changing under the watcher "
                        f"({MAX_CONFLICTS} conflicts); the observation will be retried")

    async def _commit(self, uid: str, decision: Decision, revision: int) -> bool:
        """Publish then write; False on a compare-and-set conflict."""
        assert decision.record is not None
        event = decision.event
        try:
            if event is not None:
                name = type(event).__name__
                with self._tracer.start_as_current_span(
                    f"watcher {name}", kind=SpanKind.PRODUCER,
                    attributes=_span_attributes(decision),
                ):
                    await faults.reach("watcher.before_publish")
                    await publish(self.js, pods_subject(self.node, uid), event,
                                  msg_id=msg_id(event))
                metrics.POD_EVENTS.labels(name).inc()
            value = encode(decision.record)
            key = pods_key(self.node, uid)
            if revision:
                written = await self.kv.update(key, value, last=revision)
            else:
                written = await self.kv.create(key, value)
        except KeyWrongLastSequenceError:
            return False
        except Exception as exc:
            raise ViewError(f"Pod {uid}: could not publish or persist ({exc}); "
                            "the observation will be made again after a relist") from exc
        self._stored[uid] = Stored(decision.record, int(written))
        return True

    async def _reload(self, uid: str) -> None:
        key = pods_key(self.node, uid)
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            self._stored.pop(uid, None)
            return
        except Exception as exc:
            raise ViewError(f"Pod {uid}: re-reading record {key} failed: {exc}") from exc
        self._stored[uid] = Stored(self._decode(key, uid, entry.value), int(entry.revision or 0))

    async def prune(self, ttl: float = DAY) -> int:
        """Forget tombstones older than `ttl`; returns how many were removed."""
        removed = 0
        async with self._lock:
            cutoff = self.clock() - ttl
            for uid, stored in list(self._stored.items()):
                record = stored.record
                if record is None or record.state != "gone" or record.updated_at > cutoff:
                    continue
                try:
                    await self.kv.delete(pods_key(self.node, uid), last=stored.revision)
                except KeyWrongLastSequenceError:
                    continue
                except Exception as exc:
                    raise ViewError(f"pruning tombstone of Pod {uid} failed: {exc}") from exc
                honour_cancel()
                del self._stored[uid]
                removed += 1
        return removed


def _span_attributes(decision: Decision) -> dict[str, str]:
    """What the span of an observed-and-published event says: the Pod, the event, the why."""
    record = decision.record
    assert record is not None and decision.event is not None
    return {
        "pk.pod_uid": record.uid,
        "pk.event": type(decision.event).__name__,
        "pk.pod": f"{record.namespace}/{record.name}",
        "pk.resource_version": record.resource_version,
        "pk.reason": decision.reason,
    }


def _log_decision(decision: Decision) -> None:
    record = decision.record
    assert record is not None
    logs.decision(
        log,
        decision.reason,
        pod_uid=record.uid,
        pod=f"{record.namespace}/{record.name}",
        state=record.state,
        resource_version=record.resource_version,
        event=type(decision.event).__name__ if decision.event else None,
    )
