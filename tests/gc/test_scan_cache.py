"""The scan cache keeps a Pod listing only while nothing it rests on changed (fail closed).

Each change a Pod directory can go through between two sweeps (an entry added or removed at any
level, the mark rewritten in place, a directory swapped for a symlink, a mount over it) makes the
next scan read that directory again; a listing whose ctimes are too recent to tell is not kept.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from partkeeper import workdir
from partkeeper.config import Config
from partkeeper.workdir.cache import ScanCache
from schemas import PodsGetReply
from services.gc.collect import Collector
from tests_support.gc import FakeAllocator, build_pod, device_seam, snapshot

LATER = 2**62  # a clock far ahead: every ctime counts as settled


def tick_past(root: Path) -> None:
    """Wait (bounded) until the filesystem's clock has moved past every ctime under `root`.

    Timestamps come from the kernel's coarse clock, so a change within the same tick as the
    write before it can leave the times unchanged; the cache's settle time covers that in
    service, and this stands in for it where the test's clock does not.
    """
    newest = max(os.lstat(p).st_ctime_ns for p in [root, *root.rglob("*")])
    probe = root.parent / "tick-probe"
    deadline = time.monotonic() + 5
    while True:
        probe.write_bytes(b"")
        if os.lstat(probe).st_ctime_ns > newest:
            probe.unlink()
            return
        assert time.monotonic() < deadline, "the filesystem clock did not move in 5 s"
        time.sleep(0.001)


def scan(root: Path, cache: ScanCache) -> dict[str, workdir.PodListing]:
    return {p.uid: p for p in workdir.scan_root(root, cache=cache).pods}


def sliced(root: Path, uid: str) -> Path:
    return root / uid / "c-main" / workdir.SLICED


def add_container(root: Path, uid: str) -> None:
    (root / uid / "c-side").mkdir()


def add_in_container(root: Path, uid: str) -> None:
    (root / uid / "c-main" / "stray.txt").write_bytes(b"x")


def drop_descriptor(root: Path, uid: str) -> None:
    (root / uid / "c-main" / f"partition-MIG-{uid}.json").unlink()


def add_in_sliced(root: Path, uid: str) -> None:
    (sliced(root, uid) / "new.json").write_bytes(b"{}")


def rewrite_mark_in_place(root: Path, uid: str) -> None:
    other = workdir.mark_body("0" * 8 + uid[8:], "main")  # names another Pod, same length
    with open(sliced(root, uid) / workdir.MARK, "r+b") as f:
        f.write(other)


def swap_sliced_for_symlink(root: Path, uid: str) -> None:
    target = root.parent / f"elsewhere-{uid}"
    shutil.move(sliced(root, uid), target)
    os.symlink(target, sliced(root, uid))


CHANGES: dict[str, Callable[[Path, str], None]] = {
    "a container added": add_container,
    "a file added beside the descriptor": add_in_container,
    "the descriptor removed": drop_descriptor,
    "a file added in sliced": add_in_sliced,
    "the mark rewritten in place": rewrite_mark_in_place,
    "sliced swapped for a symlink": swap_sliced_for_symlink,
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_pod_directory_is_read_again(root: Path, new_uid, change: str) -> None:
    changed, same = new_uid(), new_uid()
    for uid in (changed, same):
        build_pod(root, uid)
    cache = ScanCache(clock=lambda: LATER)
    before = scan(root, cache)
    assert cache.counts.read == 2
    assert scan(root, cache) == before and cache.counts.read == 0

    tick_past(root)
    CHANGES[change](root, changed)
    after = scan(root, cache)
    assert (cache.counts.read, cache.counts.kept) == (1, 1), f"{change} went unnoticed"
    assert after[changed] == workdir.scan_pod(root, changed)  # what a fresh scan sees
    assert after[same] == before[same]


def test_a_directory_on_another_filesystem_is_never_kept(root: Path, new_uid) -> None:
    uid = new_uid()
    build_pod(root, uid)
    seam = device_seam(root / uid / "c-main")
    cache = ScanCache(clock=lambda: LATER)
    for _ in range(2):
        workdir.scan_root(root, device_of=seam, cache=cache)
        assert cache.counts.read == 1, "a listing showing a foreign filesystem was kept"


def test_a_listing_too_recent_to_tell_is_not_kept(root: Path, new_uid) -> None:
    uid = new_uid()
    build_pod(root, uid)
    cache = ScanCache(settle_seconds=3600)  # the real clock: the tree was written just now
    for _ in range(2):
        scan(root, cache)
        assert cache.counts.read == 1, "a listing with a ctime within the settle time was kept"


def test_a_removed_pod_directory_is_forgotten(root: Path, new_uid) -> None:
    kept, removed = new_uid(), new_uid()
    for uid in (kept, removed):
        build_pod(root, uid)
    cache = ScanCache(clock=lambda: LATER)
    scan(root, cache)
    shutil.rmtree(root / removed)
    assert set(scan(root, cache)) == {kept} and cache.counts.read == 0
    build_pod(root, removed)  # the same name again: a new directory, read afresh
    scan(root, cache)
    assert cache.counts.read == 1


async def test_a_stale_listing_never_makes_the_gc_delete_more(
    nc: Client, node: str, root: Path, new_uid, allocator: FakeAllocator
) -> None:
    """What the cache rests on: a kept listing decides whether to ask, never what is deleted.

    The listing says the slice is the GC's; by the time the Pod is confirmed gone, the mark names
    another Pod. The deletion is planned on a fresh scan, which sees that, and deletes nothing.
    """
    uid = new_uid()
    build_pod(root, uid)
    stale = workdir.scan_pod(root, uid)
    assert stale.containers[0].sliced == "owned"
    rewrite_mark_in_place(root, uid)
    before = snapshot(root)
    collector = Collector(Config(nats_urls=("nats://unused",), node=node, pods_dir=root), nc)
    gone = PodsGetReply(uid=uid, state="gone", evidence="test: confirmed gone")

    outcome = await collector.collect(uid, stale, gone)
    assert outcome.verdict != "collect"
    assert snapshot(root) == before, "a stale listing made the GC delete something"


MARK_OWN, MARK_FOREIGN = "own", "foreign"
PLACES = ("", "c-main", f"c-main/{workdir.SLICED}", f"c-main/{workdir.SLICED}/cache")
Step = tuple[str, int, str]  # (action, place index, name or mark kind)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, len(PLACES) - 1), st.sampled_from("abc")),
        st.tuples(st.just("remove"), st.integers(0, len(PLACES) - 1), st.sampled_from("abc")),
        st.tuples(st.just("mark"), st.just(0), st.sampled_from([MARK_OWN, MARK_FOREIGN])),
        st.tuples(st.just("unmark"), st.just(0), st.just("")),
    ),
    min_size=1, max_size=6,
)


def apply(root: Path, uid: str, step: Step) -> None:
    action, place, name = step
    where = root / uid / PLACES[place]
    mark = root / uid / "c-main" / workdir.SLICED / workdir.MARK
    if action == "add" and where.is_dir():
        (where / name).write_bytes(b"x")
    elif action == "remove" and (where / name).is_file():
        (where / name).unlink()
    elif action == "mark" and mark.parent.is_dir():
        owner = uid if name == MARK_OWN else "0" * 8 + uid[8:]
        with open(mark, "r+b" if mark.exists() else "wb") as f:  # in place when it exists
            f.write(workdir.mark_body(owner, "main"))
    elif action == "unmark" and mark.exists():
        mark.unlink()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_the_kept_listings_always_equal_a_fresh_scan(steps: list[Step], tmp_path: Path) -> None:
    """A state machine of changes to a Pod directory, each one after the filesystem's clock moved:
    after each, the cached scan lists exactly what a fresh scan lists."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    uid = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
    build_pod(root, uid)
    cache = ScanCache(clock=lambda: LATER)
    scan(root, cache)
    for step in steps:
        tick_past(root)
        apply(root, uid, step)
        assert scan(root, cache)[uid] == workdir.scan_pod(root, uid), step
