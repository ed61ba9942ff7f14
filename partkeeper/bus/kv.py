"""A KV bucket with its JetStream context, and reading many entries at once, failing closed.

The keys come from the bucket stream's per-subject state (`STREAM.INFO` with a subject filter,
answered by the server in one reply), then each key is read by a direct get. A KV watch is not used
here: its "initial values done" marker can be delivered before values already in flight to the
client, which would make a full bucket look empty. The stream `KV_<bucket>` and the subjects
`$KV.<bucket>.<key>` are how JetStream lays out every bucket (the KV protocol), so nothing of the
client's internals is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue


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
