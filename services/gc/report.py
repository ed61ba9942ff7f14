"""Reporting what the GC does not recognise: once per thing, not once per sweep."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from partkeeper.telemetry import logs

log = logging.getLogger(__name__)

# Beyond this many remembered items the memory is cleared, so a hostile tree cannot grow it
# without bound; the price is that everything is reported once more.
MAX_REMEMBERED = 50_000


class Reporter:
    def __init__(self) -> None:
        self._seen: set[str] = set()
        self.reported = 0

    def _first_time(self, key: str) -> bool:
        if key in self._seen:
            return False
        if len(self._seen) >= MAX_REMEMBERED:
            self._seen.clear()
        self._seen.add(key)
        self.reported += 1
        return True

    def unrecognised(self, uid: str | None, items: Iterable[str]) -> None:
        for item in items:
            if self._first_time(f"u:{item}"):
                log.warning("gc does not recognise %s; leaving it in place", item,
                            extra={k: v for k, v in {"pod_uid": uid}.items() if v})

    def left(self, uid: str, items: Iterable[tuple[str, str]]) -> None:
        for path, why in items:
            if self._first_time(f"l:{path}:{why}"):
                logs.decision(log, f"gc left {path} in place: {why}", pod_uid=uid, path=path)
