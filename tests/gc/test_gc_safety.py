"""The GC and path tricks, foreign mounts, malformed input, and its fault point (invariants 3, 10).

Every test here stages something that an unsafe GC would delete and checks that nothing outside
what the GC owns changed, after the GC demonstrably looked (its consumer acknowledged the event,
and later sweeps asked about a live canary Pod).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from partkeeper import workdir
from partkeeper.faults import EXIT_STATUS
from partkeeper_sim.stack.natsserver import NatsServer
from schemas.names import STREAM_DLQ, dlq_subject, pods_subject
from tests_support import until
from tests_support.gc import (
    Canary,
    FakeAllocator,
    FakeWatcher,
    acked_through,
    announce,
    build_pod,
    device_seam,
    snapshot,
)

StartGc = Callable[..., Awaitable[None]]


def plant(root: Path, decoy: Path, uid: str, level: str) -> Path:
    """Put a symlink at `level` of the Pod's tree, pointing into a decoy tree built exactly like
    ours (descriptor, slice, a mark naming this Pod): only the link gives it away."""
    build_pod(decoy, uid)
    rel = {"pod": (uid,), "container": (uid, "c-main"), "sliced": (uid, "c-main", "sliced"),
           "cache": (uid, "c-main", "sliced", "cache")}[level]
    if level == "cache":
        build_pod(root, uid)
        real = root.joinpath(*rel)
        for child in sorted(real.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
        real.rmdir()
    link = root.joinpath(*rel)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(decoy.joinpath(*rel), target_is_directory=True)
    return link


@pytest.mark.parametrize("level", ["pod", "container", "sliced", "cache"])
async def test_a_symlink_to_a_directory_outside_is_not_followed(
    js: JetStreamContext, node: str, root: Path, tmp_path: Path, uid: str,
    new_uid: Callable[[], str], watcher: FakeWatcher, allocator: FakeAllocator,
    start_gc: StartGc, level: str,
) -> None:
    decoy = tmp_path / "decoy"
    link = plant(root, decoy, uid, level)
    decoy_before = snapshot(decoy)
    watcher.states[uid] = "gone"
    canary = Canary(root, watcher, new_uid())
    await start_gc()
    await acked_through(js, node, await announce(js, node, "PodGone", uid))
    await canary.sweeps()
    assert snapshot(decoy) == decoy_before
    assert link.is_symlink()
    if level == "cache":  # the real slice around the link went, the link and the mark stayed
        sliced = link.parent
        assert sorted(os.listdir(sliced)) == [".partkeeper-owned", "cache"]


@pytest.mark.parametrize("where", ["sliced", "cache"])
async def test_a_directory_on_another_filesystem_is_not_entered(
    js: JetStreamContext, node: str, root: Path, uid: str, new_uid: Callable[[], str],
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
    mount_tmpfs: Callable[[Path], Path], where: str,
) -> None:
    sliced = workdir.sliced_dir(root, uid, "main")
    if where == "sliced":
        # A whole tmpfs dressed as our slice, mark included.
        workdir.write_descriptor(root, uid, "main", f"MIG-{uid}", b"{}")
        mounted = mount_tmpfs(sliced)
        (mounted / workdir.MARK).write_bytes(workdir.mark_body(uid, "main"))
        (mounted / "limits.json").write_bytes(b"{}")
    else:
        build_pod(root, uid, descriptor=False)
        mounted = mount_tmpfs(sliced / "cache")
        (mounted / "blob").write_bytes(b"on another filesystem")
    on_mount = snapshot(mounted)
    watcher.states[uid] = "gone"
    canary = Canary(root, watcher, new_uid())
    await start_gc()
    await acked_through(js, node, await announce(js, node, "PodGone", uid))
    await canary.sweeps()
    assert snapshot(mounted) == on_mount
    if where == "cache":
        assert sorted(os.listdir(sliced)) == [".partkeeper-owned", "cache"]


async def test_the_device_seam_keeps_the_gc_out_of_a_foreign_container_dir(
    js: JetStreamContext, node: str, root: Path, uid: str, new_uid: Callable[[], str],
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    build_pod(root, uid, descriptor=False)
    before = snapshot(root / uid)
    watcher.states[uid] = "gone"
    canary = Canary(root, watcher, new_uid())
    await start_gc(device_of=device_seam(root / uid / "c-main"))
    await acked_through(js, node, await announce(js, node, "PodGone", uid))
    await canary.sweeps()
    assert snapshot(root / uid) == before


# --- malformed input ----------------------------------------------------------------------------


async def test_bad_uids_and_malformed_events_are_dead_lettered_and_change_nothing(
    js: JetStreamContext, node: str, root: Path, tmp_path: Path, new_uid: Callable[[], str],
    watcher: FakeWatcher, allocator: FakeAllocator, start_gc: StartGc,
) -> None:
    canary = Canary(root, watcher, new_uid())
    upper = "0B6F4A1E-2C3D-4E5F-8A9B-0C1D2E3F4A5B"
    for odd in ("not-a-uid", upper):  # directories whose names are not Pod UIDs: left alone
        sliced = root / odd / "c-main" / "sliced"
        sliced.mkdir(parents=True)
        (sliced / workdir.MARK).write_bytes(workdir.mark_body(odd, "main"))
        (sliced / "limits.json").write_bytes(b"{}")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_bytes(b"root:x:0:0")
    before = snapshot(tmp_path)
    await start_gc()
    for bad in ("../../etc", upper, "a/b"):
        watcher.states[bad] = "gone"
        await announce(js, node, "PodGone", bad)
    subject = pods_subject(node, new_uid())
    await js.publish(subject, b"not json", headers={"Nats-Msg-Id": f"garbage/{node}"})
    future = json.dumps({"v": 99, "type": "PodGone", "uid": new_uid()}).encode()
    last = await js.publish(subject, future, headers={"Nats-Msg-Id": f"future/{node}"})
    await acked_through(js, node, last.seq)
    await canary.sweeps()
    assert snapshot(tmp_path) == before
    errors = await dead_letters(js, node, 5)
    assert sum("invalid Pod UID" in e for e in errors) == 3
    assert any("schema version 99" in e for e in errors)
    assert not any(k in watcher.asked.counts for k in ("../../etc", upper, "a/b"))


async def dead_letters(js: JetStreamContext, node: str, count: int) -> list[str]:
    """The Pk-Error headers of the GC's dead letters for this node, once `count` arrived."""
    subject = dlq_subject(node, "gc")

    async def arrived() -> bool:
        info = await js.stream_info(STREAM_DLQ, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0) >= count

    await until(arrived, f"{count} dead letters on {subject}", 15)
    sub = await js.subscribe(subject, ordered_consumer=True, stream=STREAM_DLQ)
    try:
        return [((await sub.next_msg(timeout=5)).headers or {})["Pk-Error"] for _ in range(count)]
    finally:
        await sub.unsubscribe()


async def test_an_event_for_a_pod_without_a_directory_asks_nobody(
    js: JetStreamContext, node: str, uid: str, watcher: FakeWatcher, allocator: FakeAllocator,
    start_gc: StartGc,
) -> None:
    await start_gc()
    await acked_through(js, node, await announce(js, node, "PodGone", uid))
    assert uid not in watcher.asked.counts and uid not in allocator.asked.counts


# --- the fault point ----------------------------------------------------------------------------


async def test_gc_before_delete_is_reached_before_anything_is_deleted(
    nats_server: NatsServer, js: JetStreamContext, node: str, root: Path, uid: str,
    watcher: FakeWatcher, allocator: FakeAllocator,
) -> None:
    build_pod(root, uid)
    before = snapshot(root)
    watcher.states[uid] = "gone"
    env = {
        **os.environ, "NATS_URL": nats_server.url, "PK_NODE_NAME": node,
        "PK_PODS_DIR": str(root), "PK_FAULTS": "gc.before_delete=exit",
        "PK_METRICS_PORT": "0", "PK_RESYNC_SECONDS": "0.2",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.gc", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == EXIT_STATUS, stderr.decode()[-2000:]
    assert b"gc.before_delete" in stderr
    assert allocator.asked.counts.get(uid, 0) >= 1  # it had decided to delete
    assert snapshot(root) == before
