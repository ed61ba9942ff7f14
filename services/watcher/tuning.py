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
