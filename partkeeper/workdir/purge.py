"""Safe deletion for the GC: an owned `sliced/` tree, then directories that are empty.

Everything goes through directory fds opened with O_NOFOLLOW and checked for the root's device.
Regular files and directories of the root's filesystem are deleted; a symlink, a device node, a
FIFO, a socket or a mount point is reported and left where it is (and so is everything above it,
because a directory is removed only when rmdir finds it empty). The ownership mark is removed
last, so a purge interrupted half-way leaves a tree that is still recognisably ours.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from partkeeper.workdir import fd as fdops
from partkeeper.workdir.names import (
    MARK,
    SLICED,
    UnsafePath,
    WorkdirError,
    check_container,
    check_uid,
    container_entry,
    container_of,
)
from partkeeper.workdir.scan import kind_of, mark_state

# Deeper than any cache a limiter writes; a deeper tree is reported rather than recursed into.
MAX_DEPTH = 32


@dataclass(slots=True)
class Purge:
    """What one deletion did: paths are relative to the root."""

    removed: list[str] = field(default_factory=list)  # directories removed, deepest first
    files: int = 0  # regular files unlinked
    left: list[tuple[str, str]] = field(default_factory=list)  # (path, why it was left)


def collect_sliced(
    root: Path | str, uid: str, container: str, *, device_of: fdops.DeviceOf = fdops.st_device
) -> Purge:
    """Delete `<root>/<uid>/c-<container>/sliced/` if it carries the mark for this Pod/container.

    Absent directories are nothing to do. A missing or foreign mark leaves the tree untouched and
    says so in `left`.
    """
    uid = check_uid(root, uid)
    entry = container_entry(check_container(root, container))
    rel = PurePosixPath(uid, entry, SLICED)
    out = Purge()
    try:
        with (
            fdops.open_root(root, device_of=device_of) as r,
            fdops.opened(r, r.fd, uid, r.path / uid) as pod_fd,
            fdops.opened(r, pod_fd, entry, r.path / uid / entry) as cfd,
        ):
            with fdops.opened(r, cfd, SLICED, r.path / rel) as sfd:
                state = mark_state(r, sfd, uid, container)
                if state != "owned":
                    out.left.append((str(rel), f"ownership mark is {state}; not ours to delete"))
                    return out
                _purge(r, sfd, rel, 0, out, skip=MARK)
                if out.left:
                    return out
                _unlink(sfd, MARK, rel / MARK, out)
            if fdops.rmdir_if_empty(cfd, SLICED, r.path / rel):
                out.removed.append(str(rel))
    except FileNotFoundError:
        return out
    except UnsafePath as exc:
        out.left.append((_relative(root, exc.path), exc.reason))
    return out


def remove_empty(
    root: Path | str,
    uid: str,
    entries: Sequence[str],
    *,
    include_pod: bool = True,
    device_of: fdops.DeviceOf = fdops.st_device,
) -> Purge:
    """rmdir each `c-<container>` entry that is empty, then (`include_pod`) the Pod directory."""
    uid = check_uid(root, uid)
    out = Purge()
    try:
        with (
            fdops.open_root(root, device_of=device_of) as r,
            fdops.opened(r, r.fd, uid, r.path / uid) as pod_fd,
        ):
            for entry in entries:
                if container_of(entry) is None:
                    out.left.append((f"{uid}/{entry}", "not a container directory name"))
                    continue
                _rmdir_checked(r, pod_fd, PurePosixPath(uid, entry), out)
        if include_pod:
            with fdops.open_root(root, device_of=device_of) as r:
                if fdops.rmdir_if_empty(r.fd, uid, r.path / uid):
                    out.removed.append(uid)
    except FileNotFoundError:
        return out
    except UnsafePath as exc:
        out.left.append((_relative(root, exc.path), exc.reason))
    return out


def _rmdir_checked(r: fdops.Root, parent_fd: int, rel: PurePosixPath, out: Purge) -> None:
    # Open first: proves it is a directory of our filesystem, not a link or a mount point.
    try:
        with fdops.opened(r, parent_fd, rel.name, r.path / rel):
            pass
        if fdops.rmdir_if_empty(parent_fd, rel.name, r.path / rel):
            out.removed.append(str(rel))
    except FileNotFoundError:
        return
    except WorkdirError as exc:
        out.left.append((str(rel), exc.reason))


def _purge(
    r: fdops.Root, dir_fd: int, rel: PurePosixPath, depth: int, out: Purge, skip: str = ""
) -> None:
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as exc:
        out.left.append((str(rel), f"cannot list: {exc.strerror}"))
        return
    for name in names:
        if name == skip:
            continue
        st = fdops.lstat_at(dir_fd, name)
        if st is None:
            continue
        kind = kind_of(r, st)
        if kind == "file":
            _unlink(dir_fd, name, rel / name, out)
        elif kind == "dir":
            _purge_dir(r, dir_fd, rel / name, depth + 1, out)
        elif kind == "mount":
            out.left.append((str(rel / name), "is on another filesystem; left in place"))
        else:
            out.left.append((str(rel / name), f"is a {kind}; left in place"))


def _purge_dir(r: fdops.Root, parent_fd: int, rel: PurePosixPath, depth: int, out: Purge) -> None:
    if depth > MAX_DEPTH:
        out.left.append((str(rel), f"is nested deeper than {MAX_DEPTH}; left in place"))
        return
    before = len(out.left)
    try:
        with fdops.opened(r, parent_fd, rel.name, r.path / rel) as child:
            _purge(r, child, rel, depth, out)
    except FileNotFoundError:
        return
    except UnsafePath as exc:
        out.left.append((str(rel), exc.reason))
        return
    if len(out.left) == before:
        if fdops.rmdir_if_empty(parent_fd, rel.name, r.path / rel):
            out.removed.append(str(rel))
        else:
            out.left.append((str(rel), "could not be removed (written meanwhile?); left in place"))


def _unlink(dir_fd: int, name: str, rel: PurePosixPath, out: Purge) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        out.left.append((str(rel), f"cannot remove: {exc.strerror}"))
        return
    out.files += 1


def _relative(root: Path | str, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
