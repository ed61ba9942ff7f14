"""Registry leftovers a vendor driver reports as blocking its creates, removed each reconcile pass.

Hygon's driver can never again write a partition record where a directory sits (a container
runtime makes one when asked to bind a record that was already gone), so every create whose ids map
to it fails. Every driver answers `leftovers()` and `remove_leftover(path)`; only `dmi` has any
(an empty directory, removed with rmdir), the others report none. Nothing here touches a
partition: a leftover is never a live record.
"""

from __future__ import annotations

import asyncio
import logging

from partkeeper.drivers.base import Driver, DriverError
from partkeeper.telemetry.logs import decision

log = logging.getLogger(__name__)


async def sweep(driver: Driver) -> list[str]:
    """Remove what `driver.leftovers()` reports; returns the paths removed."""
    try:
        found = await asyncio.to_thread(driver.leftovers)
    except DriverError as exc:
        log.warning("listing registry leftovers failed (%s); the next pass retries", exc)
        return []
    removed = []
    for path in found:
        try:
            await asyncio.to_thread(driver.remove_leftover, path)
        except (OSError, ValueError) as exc:
            log.warning("a directory squats on the partition record %s and was kept: %s; a "
                        "person has to look at it", path, exc)
            continue
        decision(log, "removed a directory squatting on a partition record (creates at its ids "
                 "failed while it was there)", record=path)
        removed.append(path)
    return removed
