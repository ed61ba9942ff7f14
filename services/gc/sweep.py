"""The periodic sweep: every Pod directory under PK_PODS_DIR that holds something of the GC's.

Looking is local and cheap (one scan in a worker thread); only directories with something the GC
could delete cost questions, asked per UID with bounded concurrency. When the watcher or the
allocator stops answering, the rest of that sweep asks nobody: the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

from partkeeper import workdir
from partkeeper.bus import backoff
from partkeeper.lifecycle import honour_cancel
from partkeeper.telemetry import logs
from services.gc import decide
from services.gc.collect import Collector

log = logging.getLogger(__name__)

CONCURRENCY = 64


@dataclass(slots=True)
class SweepStats:
    directories: int = 0
    candidates: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    skipped: int = 0  # candidates not asked about because a question went unanswered


async def sweep_once(collector: Collector, *, concurrency: int = CONCURRENCY) -> SweepStats:
    scan = await asyncio.to_thread(
        workdir.scan_root, collector.root, device_of=collector.device_of
    )
    collector.reporter.unrecognised(None, (f"{e.name} ({e.kind})" for e in scan.others))
    stats = SweepStats(directories=len(scan.pods))
    work: list[workdir.PodListing] = []
    for listing in scan.pods:
        plan = decide.candidates(listing)
        collector.reporter.unrecognised(listing.uid, plan.report)
        if plan.verdict == "collect":
            work.append(listing)
    stats.candidates = len(work)
    pending = iter(work)

    async def worker() -> None:
        for listing in pending:
            honour_cancel()
            if stats.verdicts["unanswered"]:
                stats.skipped += 1
                continue
            outcome = await collector.collect(listing.uid, listing)
            stats.verdicts["unanswered" if outcome.unanswered else outcome.verdict] += 1

    async with asyncio.TaskGroup() as group:
        for n in range(min(concurrency, len(work))):
            group.create_task(worker(), name=f"gc-sweep-worker-{n}")
    return stats


async def run(collector: Collector, period: float) -> None:
    """Sweep every `period` seconds until cancelled; a failed sweep is retried with backoff."""
    failures = 0
    while True:
        honour_cancel()
        try:
            stats = await sweep_once(collector)
        except Exception as exc:  # a failed sweep deleted nothing more; the next one retries
            failures += 1
            wait = max(period, backoff.delay(failures, base=period))
            log.warning("gc sweep of %s failed (%s: %s); next sweep in %.1fs",
                        collector.root, type(exc).__name__, exc, wait, exc_info=True)
            await asyncio.sleep(wait)
            continue
        failures = 0
        if stats.candidates:
            logs.decision(log, "gc sweep done", directories=stats.directories,
                          candidates=stats.candidates, skipped=stats.skipped,
                          **{f"n_{k}": v for k, v in stats.verdicts.items()})
        await asyncio.sleep(period)
