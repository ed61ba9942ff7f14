"""What a sweep costs, counted rather than timed: bus round trips and Pod directories read.

The regression guard of docs/benchmarks.md (GC sweep): a steady sweep of Pods that are all live
asks the watcher once per `ask.BATCH` of them, asks the allocator nothing, and reads no Pod
directory that did not change. A change that adds a round trip per Pod, or reads every
directory again, fails here and says which count moved.
"""

from __future__ import annotations

import math
from pathlib import Path

from nats.aio.client import Client

from partkeeper import workdir
from partkeeper.config import Config
from services.gc import ask
from services.gc.collect import Collector
from services.gc.sweep import SweepStats, sweep_once
from tests_support.gc import FakeAllocator, FakeWatcher

LIVE = ask.BATCH * 2 + 7  # three batches, the last one short


def quick_pod(root: Path, uid: str) -> None:
    """A descriptor and an owned slice, written directly (no fsync): the count is the point."""
    container = root / uid / "c-main"
    (container / workdir.SLICED / "cache").mkdir(parents=True)
    (container / f"partition-MIG-{uid}.json").write_bytes(b'{"card": 0}')
    (container / workdir.SLICED / workdir.MARK).write_bytes(workdir.mark_body(uid, "main"))


def collector_for(nc: Client, node: str, root: Path) -> Collector:
    collector = Collector(Config(nats_urls=("nats://unused",), node=node, pods_dir=root), nc)
    # Every ctime counts as settled: what is measured is what a sweep re-reads, not the clock.
    collector.scan_cache = workdir.ScanCache(clock=lambda: 2**62)
    return collector


async def sweep_counted(collector: Collector) -> tuple[SweepStats, dict[str, int]]:
    before = vars(collector.asked).copy()
    stats = await sweep_once(collector)
    after = vars(collector.asked)
    return stats, {k: after[k] - before[k] for k in after}


async def test_a_steady_sweep_of_live_pods_costs_one_round_trip_per_batch_and_no_reads(
    nc: Client, node: str, root: Path, new_uid, watcher: FakeWatcher, allocator: FakeAllocator
) -> None:
    uids = [new_uid() for _ in range(LIVE)]
    for uid in uids:
        quick_pod(root, uid)
        watcher.states[uid] = "live"
    collector = collector_for(nc, node, root)
    batches = math.ceil(LIVE / ask.BATCH)

    first, asked = await sweep_counted(collector)
    assert (first.read, first.candidates) == (LIVE, LIVE)
    assert asked == {"pods_get": 0, "pods_states": batches, "claims_query": 0}

    steady, asked = await sweep_counted(collector)
    assert steady.read == 0, "a steady sweep read unchanged Pod directories again"
    assert collector.scan_cache.counts.checks == 4 * LIVE  # Pod dir, c-main, sliced, mark
    assert asked == {"pods_get": 0, "pods_states": batches, "claims_query": 0}, (
        "a steady sweep of live Pods made more bus round trips than one pods.states per batch"
    )
    assert steady.round_trips == batches
    assert steady.verdicts == {"refuse": LIVE}
    assert all(watcher.asked.counts[u] == 2 for u in uids), "every live Pod is asked each sweep"
    assert all((root / u / "c-main" / workdir.SLICED / workdir.MARK).exists() for u in uids)


async def test_a_gone_pod_costs_one_claims_query_and_is_read_afresh_before_deleting(
    nc: Client, node: str, root: Path, new_uid, watcher: FakeWatcher, allocator: FakeAllocator
) -> None:
    live, gone = new_uid(), new_uid()
    for uid in (live, gone):
        quick_pod(root, uid)
    watcher.states.update({live: "live", gone: "live"})
    collector = collector_for(nc, node, root)
    await sweep_counted(collector)
    watcher.states[gone] = "gone"  # the listing of `gone` is kept; its answer changed

    stats, asked = await sweep_counted(collector)
    assert asked == {"pods_get": 0, "pods_states": 1, "claims_query": 1}
    assert stats.verdicts == {"refuse": 1, "collect": 1}
    assert not (root / gone / "c-main" / workdir.SLICED).exists()
    assert (root / gone / "c-main" / f"partition-MIG-{gone}.json").exists()
    assert (root / live / "c-main" / workdir.SLICED / workdir.MARK).exists()
    # The deletion changed the gone Pod's directory: the next sweep reads it again.
    stats, _ = await sweep_counted(collector)
    assert stats.read == 1


async def test_a_watcher_without_pods_states_is_asked_pod_by_pod(
    nc: Client, node: str, root: Path, new_uid, allocator: FakeAllocator
) -> None:
    old = await FakeWatcher(nc, node, batch=False).start()
    try:
        uids = [new_uid() for _ in range(5)]
        for uid in uids:
            quick_pod(root, uid)
            old.states[uid] = "live"
        old.states[uids[0]] = "gone"
        collector = collector_for(nc, node, root)
        stats, asked = await sweep_counted(collector)
        assert asked == {"pods_get": 5, "pods_states": 1, "claims_query": 1}
        assert stats.verdicts == {"refuse": 4, "collect": 1}
        assert not (root / uids[0] / "c-main" / workdir.SLICED).exists()
        assert all((root / u / "c-main" / workdir.SLICED).exists() for u in uids[1:])
    finally:
        await old.stop()


async def test_an_unanswered_batch_deletes_nothing_and_stops_the_asking(
    nc: Client, node: str, root: Path, new_uid, watcher: FakeWatcher, allocator: FakeAllocator
) -> None:
    uids = [new_uid() for _ in range(ask.BATCH + 1)]
    for uid in uids:
        quick_pod(root, uid)
        watcher.states[uid] = "gone"
    watcher.states[min(uids)] = "error"  # the watcher fails the first batch (name order)
    collector = collector_for(nc, node, root)
    stats, asked = await sweep_counted(collector)
    assert asked == {"pods_get": 0, "pods_states": 1, "claims_query": 0}
    assert stats.verdicts["unanswered"] + stats.skipped == len(uids)
    assert all((root / u / "c-main" / workdir.SLICED / workdir.MARK).exists() for u in uids)
