"""Bounded exponential backoff with full jitter, the one retry schedule of the project."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


def delay(attempt: int, *, base: float = 0.2, cap: float = 30.0) -> float:
    """Seconds before retry `attempt` (1-based): uniform in [c/2, c], c = min(cap, base*2^n)."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return random.uniform(ceiling / 2, ceiling)


async def keep_following(
    what: str,
    follow: Callable[[], Awaitable[None]],
    *,
    cap: float = 5.0,
    after_gap: Callable[[], None] | None = None,
) -> None:
    """Run `follow` (a watch or subscription loop) until cancelled, starting it again with
    backoff whenever it ends or fails; `after_gap` runs after each restart's wait (for example to
    wake a recompute, since changes may have been missed meanwhile)."""
    attempt = 0
    while True:
        try:
            await follow()
            problem = "it ended"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            problem = str(exc) or type(exc).__name__
        attempt += 1
        wait = delay(attempt, cap=cap)
        log.warning("%s: %s; again in %.1fs", what, problem, wait)
        await asyncio.sleep(wait)
        if after_gap is not None:
            after_gap()
