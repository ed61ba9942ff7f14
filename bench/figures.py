"""Latency figures as the benchmarks report them: nearest-rank percentiles that count misses.

A sample that missed its deadline is kept as infinitely slow rather than dropped, so a run with
misses cannot show a better p99 than it had: with more than 1% of cycles missed, p99 reads
"missed" instead of a number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from partkeeper_sim.stack.summary import percentile

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class Latency:
    """One measured interval over a run, in milliseconds (math.inf for a miss)."""

    label: str
    n: int
    missed: int
    excluded: int  # cycles with nothing to time (said why next to the figures)
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(
        cls, label: str, seconds: Sequence[float | None], excluded: int = 0
    ) -> Latency | None:
        """None in `seconds` is a miss; returns None when there is no sample at all."""
        if not seconds:
            return None
        ms = [math.inf if s is None else s * 1000 for s in seconds]
        p50, p90, p99 = (percentile(ms, pct) for pct in PERCENTILES)
        missed = sum(1 for s in seconds if s is None)
        return cls(label, len(ms), missed, excluded, p50, p90, p99, max(ms))

    def text(self) -> str:
        parts = [f"p{pct} {fmt_ms(getattr(self, f'p{pct}'))}" for pct in PERCENTILES]
        missed = f", {self.missed} missed" if self.missed else ""
        excluded = f", {self.excluded} not timed" if self.excluded else ""
        return f"n={self.n}{missed}{excluded}: " + ", ".join(parts) + f", max {fmt_ms(self.max)}"


def fmt_ms(value: float) -> str:
    if math.isinf(value):
        return "missed"
    return f"{value:.1f} ms" if abs(value) < 100 else f"{value:.0f} ms"
