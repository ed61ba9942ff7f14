"""The periodic sweep: every Pod directory under PK_PODS_DIR that holds something of the GC's.

Looking is local and cheap (one scan in a worker thread, which reads again only the Pod
directories that changed since the last sweep: partkeeper.workdir.cache); only directories with
something the GC could delete cost questions. The watcher is asked about them in batches
(`pods.states`, `ask.BATCH` UIDs a round trip); those it confirms gone or finished are collected
with bounded concurrency, each asking the allocator's claims query. When the watcher or the
allocator stops answering, the rest of that sweep asks nobody: the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

from partkeeper import backoff, workdir
from partkeeper.lifecycle import honour_cancel
from partkeeper.telemetry import logs, metrics
from schemas import PodsGetReply
from services.gc import ask, decide
from services.gc.collect import Collector

log = logging.getLogger(__name__)

CONCURRENCY = 64


@dataclass(slots=True)
class SweepStats:
    directories: int = 0
    candidates: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    skipped: int = 0  # candidates not asked about because a question went unanswered
    read: int = 0  # Pod directories read afresh (the others were unchanged: workdir.cache)
    round_trips: int = 0  # questions sent on the bus (pods.states, pods.get, claims.query)


async def sweep_once(collector: Collector, *, concurrency: int = CONCURRENCY) -> SweepStats:
    asked_before = collector.asked.total
    scan = await asyncio.to_thread(
        workdir.scan_root, collector.root, device_of=collector.device_of,
        cache=collector.scan_cache,
    )
    collector.reporter.unrecognised(None, (f"{e.name} ({e.kind})" for e in scan.others))
    stats = SweepStats(directories=len(scan.pods), read=collector.scan_cache.counts.read)
    work: list[tuple[workdir.PodListing, decide.Plan]] = []
    for listing in scan.pods:
        plan = decide.candidates(listing)
        collector.reporter.unrecognised(listing.uid, plan.report)
        if plan.verdict == "collect":
            work.append((listing, plan))
    stats.candidates = len(work)
    dead = await _ask_states(collector, work, stats)
    pending = iter(dead)

    async def worker() -> None:
        for listing, pod in pending:
            honour_cancel()
            if stats.verdicts["unanswered"]:
                stats.skipped += 1
                continue
            outcome = await collector.collect(listing.uid, listing, pod)
            stats.verdicts["unanswered" if outcome.unanswered else outcome.verdict] += 1

    async with asyncio.TaskGroup() as group:
        for n in range(min(concurrency, len(dead))):
            group.create_task(worker(), name=f"gc-sweep-worker-{n}")
    stats.round_trips = collector.asked.total - asked_before
    return stats


async def _ask_states(
    collector: Collector, work: list[tuple[workdir.PodListing, decide.Plan]], stats: SweepStats
) -> list[tuple[workdir.PodListing, PodsGetReply]]:
    """Ask the watcher about the candidates `ask.BATCH` at a time; settle the ones it does not
    confirm gone or finished here and return the others, to be collected.

    The batches go one after the other, so an unanswered one stops the asking: its Pods count as
    unanswered and the rest are skipped, as when one pods.get went unanswered.
    """
    dead: list[tuple[workdir.PodListing, PodsGetReply]] = []
    for start in range(0, len(work), ask.BATCH):
        honour_cancel()
        batch = work[start : start + ask.BATCH]
        if stats.verdicts["unanswered"]:
            stats.skipped += len(batch)
            continue
        answers = await ask.pod_states(collector.nc, collector.node,
                                       [listing.uid for listing, _ in batch], collector.asked)
        if answers is None:
            stats.verdicts["unanswered"] += len(batch)
            metrics.GC_REFUSED.labels("pods-unanswered").inc(len(batch))
            continue
        for listing, plan in batch:
            pod = answers[listing.uid]
            if decide.confirmed_done(pod):
                dead.append((listing, pod))
            else:
                stats.verdicts[collector.refused(listing, plan, pod).verdict] += 1
    return dead


async def run(collector: Collector, period: float) -> None:
    """Sweep every `period` seconds until cancelled; a failed sweep deleted nothing more, the
    next one (after backoff, never sooner than the period) tries again."""

    async def sweep() -> None:
        honour_cancel()
        stats = await sweep_once(collector)
        if stats.candidates:
            logs.decision(log, "gc sweep done", directories=stats.directories,
                          candidates=stats.candidates, skipped=stats.skipped,
                          **{f"n_{k}": v for k, v in stats.verdicts.items()})

    await backoff.every(f"gc sweep of {collector.root}", period, sweep,
                        schedule=lambda failures: max(period, backoff.delay(failures, base=period)))
