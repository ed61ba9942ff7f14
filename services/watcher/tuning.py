"""Timings of the watcher; defaults for production, shorter ones for tests."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.names import DAY


@dataclass(frozen=True, slots=True)
class Tuning:
    # Each watch request ends after this long and is resumed; it also bounds how long a stopping
    # watcher's thread can stay blocked on a server that sends nothing.
    watch_timeout_seconds: int = 60
    # (connect, read) timeouts of LIST and GET; the read timeout is also the slack a watch read
    # gets beyond watch_timeout_seconds before the connection is deemed dead.
    request_timeout: tuple[float, float] = (3.0, 15.0)
    retry_base: float = 0.5
    retry_cap: float = 30.0
    tombstone_ttl: float = DAY
    prune_interval: float = 3600.0
    # Kubernetes Events from the audit log (recorder.py). An Event is advisory: a failed create
    # is retried with backoff for at most `event_attempts` deliveries (about 45-90 s with these
    # values), then logged and acknowledged, so it never holds the stream.
    event_attempts: int = 8
    event_retry_base: float = 1.0
    event_retry_cap: float = 30.0
    # An audit entry older than this gets no Event: the API server keeps Events for an hour by
    # default, so an older one would be recorded only to expire, or recorded a second time
    # after the first expired (a restart after a long outage replays the log).
    event_max_age: float = 3600.0
    lag_interval: float = 15.0
