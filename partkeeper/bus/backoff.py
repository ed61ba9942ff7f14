"""Bounded exponential backoff with full jitter, the one retry schedule of the project."""

from __future__ import annotations

import random


def delay(attempt: int, *, base: float = 0.2, cap: float = 30.0) -> float:
    """Seconds before retry `attempt` (1-based): uniform in [c/2, c], c = min(cap, base*2^n)."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return random.uniform(ceiling / 2, ceiling)
