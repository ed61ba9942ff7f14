"""What is in a Pod directory, read without following links or crossing mounts (the GC's input).

A listing is a snapshot that classifies every entry; deciding what may be deleted from it is the
GC's pure function. Deletion re-checks everything through fds (partkeeper.workdir.purge), so a
snapshot that went stale can make the GC do less, never more.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from partkeeper.workdir import fd as fdops
from partkeeper.workdir.names import (
    MARK,
    MARK_MAX_BYTES,
    SLICED,
    UnsafePath,
    WorkdirError,
    check_uid,
    container_of,
    is_descriptor_entry,
    mark_matches,
)
from schemas.pods import is_pod_uid

if TYPE_CHECKING:
    from partkeeper.workdir.cache import ScanCache

# What a listing was read from, relative to the root, with each one's `fstat` taken before it was
# read: the scan cache keeps a listing only while every one of them is unchanged.
Stamps = list[tuple[str, os.stat_result]]

EntryKind = Literal["dir", "file", "symlink", "mount", "other"]
SlicedState = Literal["absent", "owned", "unmarked", "bad-mark", "unsafe"]
PodState = Literal["absent", "dir", "unsafe"]


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    kind: EntryKind


@dataclass(frozen=True, slots=True)
class ContainerListing:
    entry: str  # the directory entry, "c-<container>"
    container: str
    descriptors: tuple[str, ...] = ()
    sliced: SlicedState = "absent"
    others: tuple[Entry, ...] = ()  # anything neither a descriptor nor `sliced`


@dataclass(frozen=True, slots=True)
class PodListing:
    uid: str
    state: PodState
    problem: str = ""  # why an `unsafe` Pod entry is unsafe
    containers: tuple[ContainerListing, ...] = ()
    others: tuple[Entry, ...] = ()  # entries that are not safe `c-<label>` directories


@dataclass(frozen=True, slots=True)
class RootScan:
    pods: tuple[PodListing, ...]
    others: tuple[Entry, ...]  # root entries whose name is not a Pod UID


def kind_of(r: fdops.Root, st: os.stat_result) -> EntryKind:
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "dir" if r.device_of(st) == r.dev else "mount"
    return "file" if stat.S_ISREG(st.st_mode) else "other"


def _entry(r: fdops.Root, dir_fd: int, name: str) -> Entry | None:
    st = fdops.lstat_at(dir_fd, name)
    return None if st is None else Entry(name, kind_of(r, st))


def _listdir(dir_fd: int, where: Path) -> list[str]:
    try:
        return sorted(os.listdir(dir_fd))
    except OSError as exc:
        raise WorkdirError(where, f"cannot list: {exc.strerror}") from exc


def mark_state(
    r: fdops.Root, sliced_fd: int, uid: str, container: str, stamps: Stamps | None = None,
    where: str = "",
) -> SlicedState:
    """`owned` only for a regular, small mark naming exactly this Pod and container."""
    st = fdops.lstat_at(sliced_fd, MARK)
    if st is None:
        return "unmarked"
    if stamps is not None:
        stamps.append((f"{where}/{MARK}", st))
    if not stat.S_ISREG(st.st_mode) or st.st_size > MARK_MAX_BYTES:
        return "bad-mark"
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(MARK, flags, dir_fd=sliced_fd)
    except FileNotFoundError:
        return "unmarked"
    except OSError:
        return "bad-mark"
    try:
        opened = os.fstat(fd)
        if (opened.st_ino, opened.st_dev) != (st.st_ino, st.st_dev):
            return "bad-mark"  # swapped between lstat and open
        body = os.read(fd, MARK_MAX_BYTES + 1)
    finally:
        os.close(fd)
    return "owned" if mark_matches(body, uid, container) else "bad-mark"


def _scan_container(
    r: fdops.Root, pod_fd: int, pod_path: Path, uid: str, entry: str, container: str,
    stamps: Stamps | None,
) -> ContainerListing | Entry:
    where = pod_path / entry
    try:
        cfd, st = fdops.open_dir_stat(r, pod_fd, entry, where)
    except UnsafePath:
        found = _entry(r, pod_fd, entry)
        return found or Entry(entry, "other")
    if stamps is not None:
        stamps.append((f"{uid}/{entry}", st))
    try:
        descriptors: list[str] = []
        others: list[Entry] = []
        sliced: SlicedState = "absent"
        for name in _listdir(cfd, where):
            if name == SLICED:
                sliced = _sliced_state(r, cfd, where, uid, container, stamps, f"{uid}/{entry}")
            elif is_descriptor_entry(name):
                descriptors.append(name)
            elif (found := _entry(r, cfd, name)) is not None:
                others.append(found)
        return ContainerListing(entry, container, tuple(descriptors), sliced, tuple(others))
    finally:
        os.close(cfd)


def _sliced_state(
    r: fdops.Root, cfd: int, cpath: Path, uid: str, container: str, stamps: Stamps | None,
    rel: str,
) -> SlicedState:
    try:
        sfd, st = fdops.open_dir_stat(r, cfd, SLICED, cpath / SLICED)
    except FileNotFoundError:
        return "absent"
    except UnsafePath:
        return "unsafe"
    try:
        if stamps is not None:
            stamps.append((f"{rel}/{SLICED}", st))
        return mark_state(r, sfd, uid, container, stamps, f"{rel}/{SLICED}")
    finally:
        os.close(sfd)


def scan_pod_at(r: fdops.Root, uid: str, stamps: Stamps | None = None) -> PodListing:
    """The listing of `uid` under an open root; `stamps`, if given, collects what it was read
    from (see `Stamps`)."""
    pod_path = r.path / uid
    try:
        pod_fd, st = fdops.open_dir_stat(r, r.fd, uid, pod_path)
    except FileNotFoundError:
        return PodListing(uid, "absent")
    except UnsafePath as exc:
        return PodListing(uid, "unsafe", problem=exc.reason)
    if stamps is not None:
        stamps.append((uid, st))
    try:
        containers: list[ContainerListing] = []
        others: list[Entry] = []
        for name in _listdir(pod_fd, pod_path):
            container = container_of(name)
            found = (
                _scan_container(r, pod_fd, pod_path, uid, name, container, stamps)
                if container is not None
                else _entry(r, pod_fd, name)
            )
            if isinstance(found, ContainerListing):
                containers.append(found)
            elif found is not None:
                others.append(found)
        return PodListing(uid, "dir", containers=tuple(containers), others=tuple(others))
    finally:
        os.close(pod_fd)


def scan_pod_reported(r: fdops.Root, uid: str, stamps: Stamps | None = None) -> PodListing:
    """`scan_pod_at`, with an unreadable Pod directory listed as `unsafe` rather than raised: one
    such directory is reported and left, and must not stop the whole sweep."""
    try:
        return scan_pod_at(r, uid, stamps)
    except WorkdirError as exc:
        return PodListing(uid, "unsafe", problem=str(exc))


def scan_pod(
    root: Path | str, uid: str, *, device_of: fdops.DeviceOf = fdops.st_device
) -> PodListing:
    """The listing of `<root>/<uid>`; `absent` when the root or the Pod directory does not exist."""
    uid = check_uid(root, uid)
    try:
        with fdops.open_root(root, device_of=device_of) as r:
            return scan_pod_at(r, uid)
    except FileNotFoundError:
        return PodListing(uid, "absent")


def scan_root(
    root: Path | str, *, device_of: fdops.DeviceOf = fdops.st_device,
    cache: ScanCache | None = None,
) -> RootScan:
    """Every Pod directory under the root, scanned; names that are not Pod UIDs are set apart.

    With `cache`, a Pod directory unchanged since the last scan (partkeeper.workdir.cache) is not
    read again: its listing is the one kept.
    """
    try:
        with fdops.open_root(root, device_of=device_of) as r:
            pods: list[PodListing] = []
            others: list[Entry] = []
            look = cache.begin(r) if cache is not None else scan_pod_reported
            for name in _listdir(r.fd, r.path):
                if is_pod_uid(name):
                    pods.append(look(r, name))
                elif (found := _entry(r, r.fd, name)) is not None:
                    others.append(found)
            return RootScan(tuple(pods), tuple(others))
    except FileNotFoundError:
        return RootScan((), ())  # no pods directory yet: nothing was ever written
