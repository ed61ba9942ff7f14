"""Fault points for tests (docs/contract.md section 8), in one place; inert when PK_FAULTS is unset.

`PK_FAULTS=point=action[,point=action]`; action `exit` ends the process with status 86 the first
time the point is reached, `delay:MS` sleeps that long every time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import dataclass

EXIT_STATUS = 86

POINTS = frozenset(
    {
        "allocator.after_claim",
        "allocator.after_create",
        "allocator.after_active",
        "reclaimer.after_releasing",
        "reclaimer.after_destroy",
        "gc.before_delete",
        "watcher.before_publish",
        "claims.after_write",  # a claim transition is written, its audit event not yet sent
    }
)

log = logging.getLogger(__name__)


class FaultSpecError(ValueError):
    """PK_FAULTS names an unknown point or an unknown action."""


@dataclass(frozen=True, slots=True)
class Fault:
    action: str  # "exit" or "delay"
    delay_ms: int = 0


def parse(spec: str) -> dict[str, Fault]:
    faults: dict[str, Fault] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, sep, action = item.partition("=")
        if not sep:
            raise FaultSpecError(f"PK_FAULTS entry {item!r} must look like point=action")
        if point not in POINTS:
            known = ", ".join(sorted(POINTS))
            raise FaultSpecError(f"PK_FAULTS names unknown fault point {point!r}; known: {known}")
        if action == "exit":
            faults[point] = Fault("exit")
        elif action.startswith("delay:") and action[6:].isdigit():
            faults[point] = Fault("delay", int(action[6:]))
        else:
            raise FaultSpecError(
                f"PK_FAULTS action {action!r} for {point} is not 'exit' or 'delay:MS'"
            )
    return faults


_active: dict[str, Fault] | None = None


def _faults() -> dict[str, Fault]:
    global _active
    if _active is None:
        _active = parse(os.environ.get("PK_FAULTS", ""))
    return _active


def reset(spec: str | None = None) -> None:
    """Re-read the faults (tests in one process); `spec` overrides the environment."""
    global _active
    _active = parse(spec) if spec is not None else None


async def reach(point: str) -> None:
    """Mark that `point` was reached; acts only when PK_FAULTS names it."""
    if point not in POINTS:
        raise FaultSpecError(f"fault point {point!r} is not declared in partkeeper.faults.POINTS")
    fault = _faults().get(point)
    if fault is None:
        return
    if fault.action == "exit":
        log.warning("fault point %s reached: exiting with status %d", point, EXIT_STATUS)
        sys.stderr.flush()
        os._exit(EXIT_STATUS)
    await asyncio.sleep(fault.delay_ms / 1000)
