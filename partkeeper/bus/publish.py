"""Publishing contract messages with de-duplication ids and trace context."""

from __future__ import annotations

import msgspec
from nats.js import JetStreamContext, api

from partkeeper.telemetry import tracing
from schemas import encode


async def publish(
    js: JetStreamContext,
    subject: str,
    message: msgspec.Struct,
    *,
    msg_id: str,
    timeout: float = 5.0,
) -> api.PubAck:
    """Publish `message` on `subject` with `Nats-Msg-Id: msg_id` and the current `traceparent`.

    The id must name the fact, not the attempt (e.g. PodGone/<uid>), so a retried publish after a
    crash is dropped by the stream's duplicate window rather than announced twice.
    """
    headers = tracing.inject({"Nats-Msg-Id": msg_id})
    return await js.publish(subject, encode(message), timeout=timeout, headers=headers)
