"""The demo's closing summary: counts, latency percentiles, leaks and the verdict.

Plain text, one fact per line, so it reads the same in a terminal and in a CI log; the same
lines are what `partkeeper up --demo` prints last.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from partkeeper_sim.stack.demo import Outcome
from partkeeper_sim.stack.observe import PodTrack

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (the smallest value with at least pct% of values at or below)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def admission_latencies(pods: Sequence[PodTrack]) -> list[float]:
    """Pod created -> Running, for every Pod that ran."""
    return [p.running - p.created for p in pods if p.running is not None]


def reclaim_latencies(pods: Sequence[PodTrack]) -> list[float]:
    """Pod deleted -> its partition gone from the cards; the busy one is reported apart."""
    return [
        p.reclaimed - p.deleted
        for p in pods
        if p.kind == "partition" and p.deleted is not None and p.reclaimed is not None
        and p.busy_released is None
    ]


def describe(values: Sequence[float]) -> str:
    if not values:
        return "n=0"
    parts = [f"p{pct}={percentile(values, pct) * 1000:.0f}ms" for pct in PERCENTILES]
    return f"n={len(values)} " + " ".join(parts) + f" max={max(values) * 1000:.0f}ms"


def lines(outcome: Outcome) -> list[str]:
    pods = outcome.pods
    admitted = [p for p in pods if p.running is not None]
    reclaimed = [p for p in pods if p.reclaimed is not None]
    out = [
        "partkeeper demo summary",
        f"  Pods created {len(pods)}, admitted {len(admitted)}, refused {len(outcome.refused)}, "
        f"reclaimed {len(reclaimed)} "
        f"({sum(1 for p in reclaimed if p.kind == 'partition')} partitions, "
        f"{sum(1 for p in reclaimed if p.kind == 'slice')} logical slices)",
        f"  foreign instances seen {outcome.foreign_seen} (reported, counted occupied, "
        "not destroyed)",
    ]
    if outcome.busy is not None:
        busy = outcome.busy
        after = "never" if busy.destroyed_after_release is None else \
            f"{busy.destroyed_after_release * 1000:.0f}ms after release"
        out.append(f"  busy partition {busy.instance}: destroy refused {busy.refused_attempts}x "
                   f"while held {busy.held_seconds * 1000:.0f}ms; destroyed {after}")
    if outcome.slices:
        out.append(f"  {outcome.slices}")
    if outcome.failed_card:
        out.append(f"  {outcome.failed_card}")
    refills = [p for p in pods if p.refill_of]
    if refills:
        out.append(
            f"  refills created the moment their predecessor was deleted: {len(refills)}, "
            f"admitted {sum(1 for p in refills if p.running is not None)}; "
            f"created -> Running {describe(admission_latencies(refills))}"
        )
    out += [
        f"  admission latency (Pod created -> Running): {describe(admission_latencies(pods))}",
        f"  reclaim latency (Pod deleted -> partition gone): {describe(reclaim_latencies(pods))}",
    ]
    out += [f"  refused: {p.name} ({p.resource}): {p.refused}" for p in outcome.refused]
    out.append("  leaks: " + ("; ".join(outcome.leaks) if outcome.leaks else "none"))
    if outcome.error:
        out.append(f"  error: {outcome.error}")
    out.append(f"  result: {'PASS' if outcome.passed else 'FAIL'} in {outcome.seconds:.1f}s")
    return out
