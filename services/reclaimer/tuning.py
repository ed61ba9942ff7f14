"""The reclaimer's timings and thresholds, with the retry schedule as a pure function.

Not environment variables: docs/contract.md section 4 fixes the configuration surface. Tests and
the embedded stack pass a `Tuning` to `serve` to shorten the waits.
"""

from __future__ import annotations

from dataclasses import dataclass

from partkeeper import backoff
from partkeeper.podstate import CREATE_TIMEOUT
from schemas.names import ConsumerSpec

# Failed destroys before DestroyFailed, then slow retries; also the attempts a releasing claim on
# a lost card gets before it is abandoned.
DESTROY_THRESHOLD = 5


@dataclass(frozen=True, slots=True)
class Tuning:
    destroy_threshold: int = DESTROY_THRESHOLD
    fast_base: float = 0.2
    fast_cap: float = 5.0
    slow_base: float = 10.0
    slow_cap: float = 60.0
    create_timeout: float = CREATE_TIMEOUT  # how long a never-activated claim is waited for
    event_patience: float = 10.0  # how long one delivery waits for progressing destroys
    event_redelivery_cap: float = 30.0
    now_wait: float = 8.0  # reclaim.now answers within this; the allocator asks with a 10 s timeout
    watcher_timeout: float = 2.0


DEFAULT = Tuning()

# A Pod event is the reminder that a Pod's claims must be resolved; it is redelivered until they
# are, however long a card refuses (the durable `releasing` claim holds the intent meanwhile).
# Undecodable payloads are dead-lettered on their first delivery whatever this limit says.
POD_EVENTS_CONSUMER = ConsumerSpec(ack_wait_seconds=30.0, max_deliver=1_000_000)


def retry_delay(failures: int, tuning: Tuning) -> float:
    """Seconds before the next attempt after `failures` failed ones (1-based), jittered.

    Fast and bounded up to the threshold, then slow forever: a card that refuses for hours is
    asked about once a minute, not hammered.
    """
    if failures < tuning.destroy_threshold:
        return backoff.delay(failures, base=tuning.fast_base, cap=tuning.fast_cap)
    slow = failures - tuning.destroy_threshold + 1
    return backoff.delay(slow, base=tuning.slow_base, cap=tuning.slow_cap)


def redelivery_delay(delivery: int, tuning: Tuning) -> float:
    """Nak delay for a Pod event whose claims are not all resolved yet."""
    return backoff.delay(delivery, base=1.0, cap=tuning.event_redelivery_cap)
