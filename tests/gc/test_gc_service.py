"""The GC against a real nats-server, with pods.get and claims.query answered by test tables.

Invariant 3 (docs/contract.md section 3): the GC never deletes a file it did not write, never
deletes while either question is unanswered, never deletes anything of a Pod not confirmed
gone/finished.
Invariant 10: path tricks and malformed input change nothing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from partkeeper import workdir
from tests_support import make_claim, until
from tests_support.gc import (
    Canary,
    FakeAllocator,
    FakeWatcher,
    acked_through,
    announce,
    build_pod,
    collected_event,
    consumer_state,
    snapshot,
)

StartGc = Callable[..., Awaitable[None]]


def descriptor(root: Path, uid: str, container: str = "main") -> Path:
    return root / uid / f"c-{container}" / f"partition-MIG-{uid}.json"


# --- the measured failure: live Pods keep everything ---------------------------------------------


async def test_a_live_pod_keeps_everything_through_any_events_and_sweeps(
    js: JetStreamContext, node: str, root: Path, uid: str, new_uid: Callable[[], str],
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    build_pod(root, uid)
    watcher.states[uid] = "live"
    before = snapshot(root)
    await start_gc()
    last = 0
    for i in range(4):
        # Stale or wrong events naming the Pod, and events about other Pods: none may matter.
        for kind in ("PodSeen", "PodFinished", "PodGone"):
            last = await announce(js, node, kind, uid, rv=str(i), tag="/bogus")
        last = await announce(js, node, "PodGone", new_uid())
    await watcher.asked.wait(uid, 12)  # eight events naming it, and sweeps
    await acked_through(js, node, last)
    assert snapshot(root) == before
    assert allocator.asked.counts == {}


async def test_a_burst_of_admissions_before_their_first_sighting_survives(
    js: JetStreamContext, node: str, root: Path, tmp_path: Path, new_uid: Callable[[], str],
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    burst = [new_uid() for _ in range(24)]
    reference = tmp_path / "reference"  # what each Pod directory must still hold at the end
    for u in burst:
        build_pod(reference, u)
    await start_gc()
    finished = new_uid()
    # The allocator writes while the GC sweeps; the watcher has not seen these Pods yet.
    await asyncio.gather(*(asyncio.to_thread(build_pod, root, u) for u in [*burst, finished]))
    watcher.states[finished] = "finished"
    for u in burst:
        await announce(js, node, "PodSeen", u)
    await announce(js, node, "PodFinished", finished)
    await until(lambda: not (root / finished / "c-main" / "sliced").exists(), "finished collected")
    for u in burst:
        await watcher.asked.wait(u, 3)
        assert snapshot(root / u) == snapshot(reference / u)
    for u in burst:  # now sighted: live
        watcher.states[u] = "live"
    for u in burst:
        await watcher.asked.wait(u, 5)
        assert snapshot(root / u) == snapshot(reference / u)
    assert set(allocator.asked.counts) == {finished}


# --- what is collected, and what stays -----------------------------------------------------------


async def test_a_gone_pod_loses_only_its_slices(
    js: JetStreamContext, node: str, root: Path, uid: str,
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    build_pod(root, uid)
    build_pod(root, uid, container="side", descriptor=False)
    body = descriptor(root, uid).read_bytes()
    watcher.states[uid] = "gone"
    await start_gc()
    await announce(js, node, "PodGone", uid)
    await until(lambda: not (root / uid / "c-side").exists(), "c-side collected")
    await until(lambda: not (root / uid / "c-main" / "sliced").exists(), "c-main/sliced gone")
    assert snapshot(root / uid) == {"c-main": "dir", f"c-main/{descriptor(root, uid).name}": body}
    event = await collected_event(js, node)
    assert event.pod_uid == uid and event.node == node
    assert sorted(event.removed) == sorted(
        [f"{uid}/c-main/sliced", f"{uid}/c-side/sliced", f"{uid}/c-side"]
    )
    # The reclaimer removes the descriptor after the destroy: then the tree is gone.
    assert workdir.remove_descriptor(root, uid, "main", f"MIG-{uid}")
    assert os.listdir(root) == []


async def test_a_finished_pod_directory_is_collected_by_the_sweep(
    js: JetStreamContext, node: str, root: Path, uid: str,
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    build_pod(root, uid, descriptor=False)
    watcher.states[uid] = "finished"
    await start_gc()  # no event: the periodic sweep finds it
    await until(lambda: not (root / uid).exists(), "the Pod directory collected")
    event = await collected_event(js, node)
    assert sorted(event.removed) == sorted([f"{uid}/c-main/sliced", f"{uid}/c-main", uid])
    assert allocator.asked.counts[uid] >= 1


async def test_never_deletes_what_it_did_not_write(
    js: JetStreamContext, node: str, root: Path, uid: str, new_uid: Callable[[], str],
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    build_pod(root, uid)
    (root / uid / "c-main" / "notes.txt").write_bytes(b"an operator's note")
    unmarked = workdir.write_sliced(root, uid, "plain", {"limits.json": b"{}"})
    (unmarked / workdir.MARK).unlink()  # the same path, but no mark: not ours
    other = "ffffffff-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
    copied = workdir.write_sliced(root, uid, "copy", {"limits.json": b"{}"})
    (copied / workdir.MARK).write_bytes(workdir.mark_body(other, "copy"))  # another Pod's mark
    (root / uid / "stray").mkdir()
    canary = Canary(root, watcher, new_uid())
    keep = {k: v for k, v in snapshot(root).items() if not k.startswith(f"{uid}/c-main/sliced")}
    watcher.states[uid] = "gone"
    await start_gc()
    await announce(js, node, "PodGone", uid)
    await until(lambda: not (root / uid / "c-main" / "sliced").exists(), "owned slice gone")
    await canary.sweeps()  # later sweeps looked again
    assert snapshot(root) == keep


# --- unanswered questions delete nothing ---------------------------------------------------------


async def test_no_watcher_means_nothing_is_deleted(
    js: JetStreamContext, node: str, root: Path, uid: str,
    allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    build_pod(root, uid)
    before = snapshot(root)
    await start_gc()
    await announce(js, node, "PodGone", uid)
    async def retried_twice() -> bool:
        return (await consumer_state(js, node)).delivered.consumer_seq >= 3

    await until(retried_twice, "the GC retried the unanswered PodGone", 15)
    assert snapshot(root) == before
    assert allocator.asked.counts == {}


async def test_a_watcher_error_means_nothing_is_deleted(
    js: JetStreamContext, node: str, root: Path, uid: str,
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    build_pod(root, uid)
    before = snapshot(root)
    watcher.states[uid] = "error"
    await start_gc()
    await announce(js, node, "PodGone", uid)
    await watcher.asked.wait(uid, 4)
    assert snapshot(root) == before and allocator.asked.counts == {}


@pytest.mark.parametrize("allocator_is", ["absent", "failing"])
async def test_unanswered_claims_query_means_nothing_is_deleted(
    js: JetStreamContext, nc: Client, node: str, root: Path, uid: str,
    watcher: FakeWatcher, start_gc: StartGc, allocator_is: str,
) -> None:
    build_pod(root, uid)
    before = snapshot(root)
    watcher.states[uid] = "gone"
    allocator = FakeAllocator(nc, node)
    allocator.failing = allocator_is == "failing"
    if allocator.failing:
        await allocator.start()
    try:
        await start_gc()
        await announce(js, node, "PodGone", uid)
        await watcher.asked.wait(uid, 4)
        assert snapshot(root) == before
        allocator.failing = False
        if allocator.service is None:
            await allocator.start()
        await until(lambda: not (root / uid / "c-main" / "sliced").exists(), "collected")
    finally:
        await allocator.stop()


async def test_a_claim_still_creating_defers_deletion(
    js: JetStreamContext, node: str, root: Path, uid: str,
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    build_pod(root, uid)
    before = snapshot(root)
    watcher.states[uid] = "finished"
    allocator.claims[uid] = [make_claim("k1", 0, 1, state="creating", uid=uid)]
    await start_gc()
    await allocator.asked.wait(uid, 3)
    assert snapshot(root) == before
    allocator.claims[uid] = [make_claim("k1", 0, 1, state="active", uid=uid)]
    await until(lambda: not (root / uid / "c-main" / "sliced").exists(), "collected")
