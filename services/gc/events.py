"""The PK_PODS consumer: PodFinished and PodGone trigger a collection; PodSeen changes nothing."""

from __future__ import annotations

import logging

from partkeeper.bus import Permanent, Retry
from partkeeper.bus.consumer import Delivery, Handler
from partkeeper.telemetry import logs
from schemas import PodEvent, PodSeen, decode
from schemas.names import CONSUMER
from schemas.pods import InvalidPodUID, validate_pod_uid
from services.gc.collect import Collector

log = logging.getLogger(__name__)


def decode_event(data: bytes) -> PodEvent:
    return decode(data, PodEvent, what="pod event")


def handler(collector: Collector, *, max_deliver: int = CONSUMER.max_deliver) -> Handler[PodEvent]:
    async def handle(event: PodEvent, delivery: Delivery) -> None:
        if isinstance(event, PodSeen):
            return
        kind = type(event).__name__
        try:
            uid = validate_pod_uid(event.uid)
        except InvalidPodUID as exc:
            raise Permanent(f"{kind} names an invalid Pod UID ({exc}); nothing deleted") from exc
        outcome = await collector.collect(uid)
        if outcome.verdict != "defer":
            return
        if delivery.attempt + 1 < max_deliver:
            raise Retry(f"Pod {uid}: {outcome.reason}; will retry the {kind} event")
        # The directory itself is the durable state: the periodic sweep finds it again, so a long
        # outage of the watcher or the allocator does not flood the dead-letter stream.
        logs.decision(log, f"gc hands Pod {uid} to the periodic sweep after "
                      f"{delivery.attempt} attempts: {outcome.reason}", pod_uid=uid)

    return handle
