"""A KV bucket with its JetStream context, reading many entries at once (failing closed), and
watching keys.

`entries`: the keys come from the bucket stream's per-subject state (`STREAM.INFO` with a subject
filter, answered by the server in one reply), then each key is read by a direct get. nats-py's KV
watch is used nowhere: its "initial values done" marker can be delivered before values already in
flight to the client (it is decided by a `consumer_info` asked after subscribing), which would
make a full bucket look empty; and its consumer is created without a name, its filter only in the
request body, so no permission can keep it to one node's keys. `watch` is ours instead
(bus/ordered.py): the marker comes from the server's own counts, and the consumer's filter is in
the create subject. The stream `KV_<bucket>` and the subjects `$KV.<bucket>.<key>` are how
JetStream lays out every bucket (the KV protocol), so nothing of the client's internals is read.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KV_DEL, KV_MARKER_REASON, KV_OP, KV_PURGE, KeyValue

from partkeeper.bus.ordered import HEARTBEAT_SECONDS, INACTIVE_SECONDS, OrderedWatch


@dataclass(frozen=True, slots=True)
class Bucket:
    js: JetStreamContext
    name: str
    kv: KeyValue

    @classmethod
    async def open(cls, js: JetStreamContext, name: str) -> Bucket:
        return cls(js, name, await js.key_value(name))

    @property
    def stream(self) -> str:
        return f"KV_{self.name}"

    @property
    def prefix(self) -> str:
        return f"$KV.{self.name}."


async def entries(bucket: Bucket, pattern: str) -> dict[str, KeyValue.Entry]:
    """The latest live entry of every key matching `pattern` (NATS wildcards).

    Raises on any failure; an empty dict means the server said there are none. Deleted or purged
    keys are left out.
    """
    prefix = bucket.prefix
    info = await bucket.js.stream_info(bucket.stream, subjects_filter=f"{prefix}{pattern}")
    found: dict[str, KeyValue.Entry] = {}
    for subject in sorted(info.state.subjects or {}):
        key = subject[len(prefix) :]
        try:
            found[key] = await bucket.kv.get(key)
        except KeyNotFoundError:
            continue  # a delete or purge marker is the key's latest entry
    return found


async def watch(
    nc: Client, bucket: str, pattern: str, *, meta_only: bool = False, label: str = "pk-watch",
    heartbeat: float = HEARTBEAT_SECONDS, inactive: float = INACTIVE_SECONDS,
) -> AsyncGenerator[KeyValue.Entry | None, None]:
    """The latest entry of every key matching `pattern`, then every change, in revision order;
    `None` once, when the entries present at the start have all come (see bus/ordered.py).

    Deletes and purges come as entries with their operation. `meta_only` leaves the values out.
    Close it (`contextlib.aclosing`) to drop the subscription; `heartbeat` and `inactive` are
    OrderedWatch's.
    """
    prefix = f"$KV.{bucket}."
    async with OrderedWatch(nc, f"KV_{bucket}", f"{prefix}{pattern}",
                            deliver=api.DeliverPolicy.LAST_PER_SUBJECT, headers_only=meta_only,
                            label=label, heartbeat=heartbeat, inactive=inactive) as ordered:
        async for msg in ordered:
            yield None if msg is None else _entry(bucket, prefix, msg)


def _entry(bucket: str, prefix: str, msg: Msg) -> KeyValue.Entry:
    meta = msg.metadata
    return KeyValue.Entry(bucket=bucket, key=msg.subject[len(prefix):], value=msg.data,
                          revision=meta.sequence.stream, delta=meta.num_pending,
                          created=int(meta.timestamp.timestamp()),
                          operation=_operation(msg.headers or {}))


def _operation(headers: dict[str, str]) -> str | None:
    """The KV operation of an entry: a put (None), KV_DEL or KV_PURGE.

    Deletes and purges say so in `KV-Operation`; markers the server places itself (nats-server
    2.11+, a key's TTL or the bucket's age limit) say why in `Nats-Marker-Reason` instead
    (ADR-48): an expiry or purge reads as a purge, a removal as a delete.
    """
    if KV_OP in headers:
        return headers[KV_OP]
    reason = headers.get(KV_MARKER_REASON)
    if reason in ("MaxAge", "Purge"):
        return KV_PURGE
    if reason == "Remove":
        return KV_DEL
    return None
