"""Tunables of the allocator that are not configuration: the defaults are the documented ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from partkeeper import backoff
from partkeeper.drivers import Driver
from partkeeper.limiter import LOCK_DIR


@dataclass(frozen=True, slots=True)
class LookupPolicy:
    """The one bounded retry for finding a Pod while the watcher catches up (every call site)."""

    attempts: int = 8
    base: float = 0.05
    cap: float = 1.0
    timeout: float = 2.0  # per request

    def delay(self, attempt: int) -> float:
        return backoff.delay(attempt, base=self.base, cap=self.cap)


@dataclass(frozen=True, slots=True)
class Options:
    room_wait_seconds: float = 30.0  # how long an Allocate waits for room before refusing
    # How long an Allocate waits for several candidate Pods to narrow to one (a rejected Pod's
    # Failed status reaching the API server) before refusing rather than guessing.
    choose_wait_seconds: float = 10.0
    kubelet_poll_seconds: float = 1.0  # stat poll of kubelet.sock (no inotify in the stdlib)
    hardware_poll_seconds: float = 1.0  # enumeration of the cards for foreign changes
    reclaim_timeout: float = 10.0  # how long reclaim.now may take to answer
    lookup: LookupPolicy = field(default_factory=LookupPolicy)
    driver: Driver | None = None  # an already opened driver (tests, the embedded stack)
    # PK_SLICE_LIMITER=hami-core: HAMi-core's lock dir, made at start, mounted into containers.
    limiter_lock_dir: Path = Path(LOCK_DIR)
