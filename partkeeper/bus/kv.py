"""Reading many KV entries at once, failing closed.

The keys come from the bucket stream's per-subject state (`STREAM.INFO` with a subject filter,
answered by the server in one reply), then each key is read by a direct get. A KV watch is not used
here: its "initial values done" marker can be delivered before values already in flight to the
client, which would make a full bucket look empty.
"""

from __future__ import annotations

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue


async def entries(kv: KeyValue, pattern: str) -> dict[str, KeyValue.Entry]:
    """The latest live entry of every key matching `pattern` (NATS wildcards).

    Raises on any failure; an empty dict means the server said there are none. Deleted or purged
    keys are left out.
    """
    prefix = kv._pre  # "$KV.<bucket>." — nats-py keeps the bucket's subject prefix here
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{prefix}{pattern}")
    found: dict[str, KeyValue.Entry] = {}
    for subject in sorted(info.state.subjects or {}):
        key = subject[len(prefix) :]
        try:
            found[key] = await kv.get(key)
        except KeyNotFoundError:
            continue  # a delete or purge marker is the key's latest entry
    return found
