"""Liveness and readiness of a service process, for the kubelet's probes.

One registry per process (`HEALTH`), fed by the service and read by the metrics HTTP server
(`partkeeper.telemetry.metrics.serve`), which answers `/livez` and `/readyz` next to `/metrics`:

- live: the event loop still runs: `beat()` (a task of the process) stamps the time every second,
  and a stamp older than `stale_after` seconds means a wedged loop, which a restart cures.
- ready: every registered condition holds. A service registers what its work needs, scoped to the
  code that provides it (`with HEALTH.condition("nats", lambda: nc.is_connected): ...`), so a
  condition disappears with the thing it describes. Conditions are read from the HTTP thread, so
  they must be cheap, non-blocking reads of state the loop keeps.

The answer's body names each condition and whether it holds, so `kubectl describe pod` shows
which one failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

Check = Callable[[], bool]

BEAT_SECONDS = 1.0
STALE_AFTER_SECONDS = 15.0


class Health:
    def __init__(self, stale_after: float = STALE_AFTER_SECONDS) -> None:
        self.stale_after = stale_after
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()
        self._last_beat: float | None = None

    @contextlib.contextmanager
    def condition(self, name: str, check: Check) -> Iterator[None]:
        """Readiness needs `check()` to hold while the block runs; registering a name again
        replaces the earlier check."""
        with self._lock:
            self._checks[name] = check
        try:
            yield
        finally:
            with self._lock:
                if self._checks.get(name) is check:
                    del self._checks[name]

    def readiness(self) -> tuple[bool, dict[str, bool]]:
        """(ready, each condition's value). Nothing registered is not ready: the service has not
        said what it needs yet. A check that raises counts as not holding."""
        with self._lock:
            checks = dict(self._checks)
        results = {name: _holds(check) for name, check in sorted(checks.items())}
        return bool(results) and all(results.values()), results

    def liveness(self, now: float | None = None) -> tuple[bool, float | None]:
        """(live, seconds since the last beat). Live until the first beat: the loop is starting."""
        if self._last_beat is None:
            return True, None
        age = (time.monotonic() if now is None else now) - self._last_beat
        return age <= self.stale_after, age

    def stamp(self) -> None:
        self._last_beat = time.monotonic()

    async def beat(self, every: float = BEAT_SECONDS) -> None:
        """Stamp the time every `every` seconds until cancelled: the loop is alive."""
        while True:
            self.stamp()
            await asyncio.sleep(every)


def _holds(check: Check) -> bool:
    try:
        return bool(check())
    except Exception:  # a probe must answer; a failing check is a condition that does not hold
        return False


HEALTH = Health()
