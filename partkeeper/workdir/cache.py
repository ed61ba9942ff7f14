"""Pod listings kept between sweeps while what they were read from has not changed.

A steady sweep of Pods that are all live reads the same trees again and again. A fresh listing of
one Pod costs about eighteen syscalls (open, fstat, getdents, close per directory, and the mark
read); telling that nothing changed costs one `lstat` per directory and one for the mark.

A listing is kept with the `fstat` of each directory it listed and of the mark it read, each taken
before it was read through (`scan.Stamps`). On the next sweep it is used again only if every one
of them still has the same device, inode, size, mtime and ctime. Adding, removing or renaming an
entry changes its directory's mtime and ctime; rewriting the mark in place changes the mark's;
a mount over any of them changes the device and inode `lstat` sees; nobody can set a ctime back.
Two things keep the comparison honest:

- a timestamp is only as fine as the kernel's coarse clock, so a change in the same tick as the
  read would leave the stamp unchanged. A listing is kept only if every ctime it rests on is at
  least `settle_seconds` older than the start of the scan (git calls this the racy-timestamp
  case);
- a listing that shows something refused (a Pod entry that is unsafe, a directory on another
  filesystem, a symlink where a directory should be) is never kept: an unmount does not touch the
  parent directory's times.

Whatever is kept is advisory, as every listing is: it decides whether the GC asks about a Pod,
never what it deletes. Deletions are planned on a fresh scan through fds after both questions
were answered (services/gc/collect.py), so a stale listing can make the GC ask for nothing or
do less, never more.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from partkeeper.workdir import fd as fdops
from partkeeper.workdir.scan import PodListing, Stamps, scan_pod_reported

# Far coarser than any local filesystem's timestamps (a kernel tick is at most 10 ms).
SETTLE_SECONDS = 1.0

Stamp = tuple[int, int, int, int, int]


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class Kept:
    stamps: tuple[tuple[str, Stamp], ...]
    listing: PodListing


@dataclass(slots=True)
class Counts:
    """One scan's work: Pod directories read afresh, listings kept, `lstat`s spent checking."""

    read: int = 0
    kept: int = 0
    checks: int = 0


def keepable(listing: PodListing) -> bool:
    if listing.state != "dir":
        return False
    refused = ("mount", "symlink", "other")
    if any(e.kind in refused for e in listing.others):
        return False
    return all(
        c.sliced != "unsafe" and not any(e.kind in refused for e in c.others)
        for c in listing.containers
    )


class ScanCache:
    """Kept listings of one pods root. Not thread-safe: one scan at a time (the GC sweeps
    serially)."""

    def __init__(
        self, *, settle_seconds: float = SETTLE_SECONDS, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.settle_ns = int(settle_seconds * 1e9)
        self.clock = clock
        self.counts = Counts()  # of the latest scan
        self._kept: dict[str, Kept] = {}
        self._next: dict[str, Kept] = {}
        self._root: tuple[int, int] | None = None
        self._trust_before = 0

    def begin(self, r: fdops.Root) -> Callable[[fdops.Root, str], PodListing]:
        """Start a scan of the open root; returns how to look at each Pod directory in it.

        What the previous scan kept is used only for the names this scan looks at, so a Pod
        directory that went away is forgotten.
        """
        st = os.fstat(r.fd)
        root = (r.dev, st.st_ino)
        self._kept = self._next if root == self._root else {}
        self._next = {}
        self._root = root
        self._trust_before = self.clock() - self.settle_ns
        self.counts = Counts()
        return self.look

    def look(self, r: fdops.Root, uid: str) -> PodListing:
        kept = self._kept.get(uid)
        if kept is not None and self._unchanged(r, kept):
            self.counts.kept += 1
            self._next[uid] = kept
            return kept.listing
        stamps: Stamps = []
        listing = scan_pod_reported(r, uid, stamps)
        self.counts.read += 1
        if keepable(listing) and all(st.st_ctime_ns < self._trust_before for _, st in stamps):
            self._next[uid] = Kept(tuple((p, stamp_of(st)) for p, st in stamps), listing)
        return listing

    def _unchanged(self, r: fdops.Root, kept: Kept) -> bool:
        # Outermost first: once the Pod directory is the same inode with the same entries, the
        # paths below it name the entries that were listed.
        for path, stamp in kept.stamps:
            self.counts.checks += 1
            try:
                st = os.stat(path, dir_fd=r.fd, follow_symlinks=False)
            except OSError:
                return False
            if stamp_of(st) != stamp:
                return False
        return True
