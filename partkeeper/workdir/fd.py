"""Directory file descriptors: the only way this package reaches anything below the root.

Every step below the root is `openat(parent_fd, name, O_DIRECTORY | O_NOFOLLOW)` followed by an
`fstat` device check, so a symlink planted at any level is refused (ELOOP) rather than followed,
and a directory on another filesystem is refused rather than entered. The root itself is opened
as configured: PK_PODS_DIR is the operator's choice, symlinks in its own path included.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from partkeeper.workdir.names import DIR_MODE, FILE_MODE, TEMP_PREFIX, UnsafePath, WorkdirError

# The device a stat result lives on. A seam so tests can stage "another filesystem" without a mount.
DeviceOf = Callable[[os.stat_result], int]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def st_device(st: os.stat_result) -> int:
    return st.st_dev


@dataclass(frozen=True, slots=True)
class Root:
    """An open root directory: its fd, its path (for messages) and the device nothing may leave."""

    fd: int
    path: Path
    dev: int
    device_of: DeviceOf


@contextlib.contextmanager
def open_root(
    path: Path | str, *, create: bool = False, device_of: DeviceOf = st_device
) -> Iterator[Root]:
    path = Path(path)
    if create:
        try:
            os.makedirs(path, mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise WorkdirError(path, f"cannot create the pods directory: {exc.strerror}") from exc
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise  # callers decide what an absent root means (nothing to read, nothing to delete)
    except OSError as exc:
        raise WorkdirError(path, f"cannot open the pods directory: {exc.strerror}") from exc
    try:
        yield Root(fd, path, device_of(os.fstat(fd)), device_of)
    finally:
        os.close(fd)


def open_dir(root: Root, parent_fd: int, name: str, where: Path, *, create: bool = False) -> int:
    """Open directory `name` under `parent_fd` without following a link or crossing a mount.

    `where` is the path the entry stands for, used only in error messages. Raises
    FileNotFoundError when it does not exist (and `create` is false), UnsafePath for a symlink, a
    non-directory or another filesystem.
    """
    if create:
        try:
            os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
        except FileExistsError:
            pass
        else:
            created = _open_checked(root, parent_fd, name, where)
            os.fchmod(created, DIR_MODE)  # exact mode whatever the umask
            return created
    return _open_checked(root, parent_fd, name, where)


def _open_checked(root: Root, parent_fd: int, name: str, where: Path) -> int:
    return open_dir_stat(root, parent_fd, name, where)[0]


def open_dir_stat(root: Root, parent_fd: int, name: str, where: Path) -> tuple[int, os.stat_result]:
    """`open_dir` without `create`, also returning the `fstat` of what was opened (taken before
    anything is read through the fd, so a later change to the directory changes its ctime)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(where)) from exc
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            # With O_DIRECTORY, Linux reports a symlink as ENOTDIR; lstat tells the two apart.
            st = lstat_at(parent_fd, name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise UnsafePath(where, "is a symbolic link; refusing to follow it") from exc
            raise UnsafePath(where, "is not a directory") from exc
        raise WorkdirError(where, f"cannot open: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePath(where, "is not a directory")
        if root.device_of(st) != root.dev:
            raise UnsafePath(where, "is on another filesystem; refusing to enter it")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


@contextlib.contextmanager
def opened(
    root: Root, parent_fd: int, name: str, where: Path, *, create: bool = False
) -> Iterator[int]:
    fd = open_dir(root, parent_fd, name, where, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def write_atomic(dir_fd: int, name: str, body: bytes, where: Path, *, durable: bool = True) -> None:
    """Write `body` to `name` in `dir_fd` all-or-nothing: temp file, rename.

    The rename makes it all-or-nothing for every reader and across a crash of the writer (the
    page cache survives a process). `durable` adds an fsync of the file before the rename and of
    the directory after it, which only a power loss or a kernel crash needs: the write is then on
    disk when this returns. Which files need that: docs/gc.md, "Durability of the files".
    """
    temp = f"{TEMP_PREFIX}{name}-{secrets.token_hex(4)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(temp, flags, FILE_MODE, dir_fd=dir_fd)
        try:
            os.fchmod(fd, FILE_MODE)
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        # rename replaces a symlink or file at `name` itself and never writes through it.
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        if durable:
            os.fsync(dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise WorkdirError(where, f"cannot write: {exc.strerror}") from exc


def rmdir_if_empty(dir_fd: int, name: str, where: Path) -> bool:
    """Remove an empty directory; False when it is not empty or already gone.

    rmdir itself is the emptiness check, so nothing written concurrently can be lost.
    """
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        if exc.errno == errno.ENOTDIR:
            raise UnsafePath(where, "is not a directory") from exc
        raise WorkdirError(where, f"cannot remove: {exc.strerror}") from exc
    return True
