"""Reading many KV entries at once, through a server-side filtered watch (one round of messages)."""

from __future__ import annotations

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue


async def entries(kv: KeyValue, pattern: str, *, timeout: float = 5.0) -> dict[str, KeyValue.Entry]:
    """The latest live entry of every key matching `pattern` (NATS wildcards).

    Raises on any failure; an empty dict means the server said there are none. The server filters
    by subject, so a node reads only its own keys.
    """
    watcher = await kv.watch(pattern, ignore_deletes=False)
    found: dict[str, KeyValue.Entry] = {}
    try:
        while True:
            entry = await watcher.updates(timeout=timeout)
            if entry is None:
                break
            if entry.operation in (KV_DEL, KV_PURGE):
                found.pop(entry.key, None)
            else:
                found[entry.key] = entry
    finally:
        await watcher.stop()
    return found
