"""The allocator's and reclaimer's side: write descriptors and slice artifacts, remove descriptors.

Each call walks from the root through directory fds (partkeeper.workdir.fd), so a symlink or a
foreign mount planted at the Pod, container or sliced level makes the call fail with UnsafePath
instead of writing somewhere else.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from partkeeper.workdir import fd as fdops
from partkeeper.workdir.names import (
    MARK,
    SLICED,
    InvalidName,
    UnsafePath,
    WorkdirError,
    check_container,
    check_token,
    check_uid,
    container_dir,
    container_entry,
    descriptor_entry,
    mark_body,
)

# The GC may remove an empty Pod directory between our mkdir and our open; a few fresh walks
# settle that race (it only happens for Pods already confirmed gone or finished).
_WALK_ATTEMPTS = 3
CACHE_MODE = 0o777  # a slice's cache dir: written by the container's processes

T = TypeVar("T")


def _in_container(
    root: Path, uid: str, container: str, work: Callable[[fdops.Root, int], T]
) -> T:
    """Create (as needed) and open `<root>/<uid>/c-<container>`, then run `work(root, fd)`."""
    uid = check_uid(root, uid)
    entry = container_entry(check_container(root, container))
    pod_path = root / uid
    for attempt in range(1, _WALK_ATTEMPTS + 1):
        with fdops.open_root(root, create=True) as r:
            try:
                pod_fd = fdops.open_dir(r, r.fd, uid, pod_path, create=True)
                try:
                    cfd = fdops.open_dir(r, pod_fd, entry, pod_path / entry, create=True)
                finally:
                    os.close(pod_fd)
            except FileNotFoundError:
                if attempt == _WALK_ATTEMPTS:
                    raise WorkdirError(
                        pod_path, "was removed while being written; giving up"
                    ) from None
                continue
            try:
                return work(r, cfd)
            finally:
                os.close(cfd)
    raise AssertionError("unreachable")  # pragma: no cover


def write_descriptor(
    root: Path | str, uid: str, container: str, mig_uuid: str, body: bytes
) -> Path:
    """Write `partition-<mig_uuid>.json` for this container atomically; return its path.

    Not fsynced: what it describes does not outlive a power loss, and nothing reads its body
    after one (docs/gc.md, "Durability of the files")."""
    root = Path(root)
    name = descriptor_entry(check_token(root, mig_uuid, "MIG UUID"))
    path = container_dir(root, uid, container) / name
    _in_container(root, uid, container,
                  lambda _r, cfd: fdops.write_atomic(cfd, name, body, path, durable=False))
    return path


def write_sliced(
    root: Path | str, uid: str, container: str, files: dict[str, bytes], cache_dir: str = "cache"
) -> Path:
    """Write the limiter files, the cache dir and the ownership mark under `sliced/`; return it.

    The mark goes first: from the first byte on, the tree is recognisably the allocator's, so a
    crash half-way leaves something the GC can collect rather than something it must report.
    """
    root = Path(root)
    check_token(root, cache_dir, "cache directory name")
    for name in files:
        check_token(root, name, "sliced file name")
        if name == cache_dir:
            raise InvalidName(root, f"sliced file {name!r} collides with the cache directory")
    sliced_path = container_dir(root, uid, container) / SLICED

    def work(r: fdops.Root, cfd: int) -> None:
        with fdops.opened(r, cfd, SLICED, sliced_path, create=True) as sfd:
            fdops.write_atomic(sfd, MARK, mark_body(uid, container), sliced_path / MARK)
            for name, body in sorted(files.items()):
                fdops.write_atomic(sfd, name, body, sliced_path / name)
            with fdops.opened(r, sfd, cache_dir, sliced_path / cache_dir, create=True) as cfd:
                # The container's processes write here whatever their user (HAMi-core's shared
                # cache file): HAMi's device plugin makes its cache dir 0777 for the same reason.
                os.fchmod(cfd, CACHE_MODE)

    _in_container(root, uid, container, work)
    return sliced_path


def remove_descriptor(root: Path | str, uid: str, container: str, mig_uuid: str) -> bool:
    """Unlink exactly this descriptor, then the container and Pod dirs if they are now empty.

    Returns False when the descriptor (or its directory) was already absent. Anything else at the
    descriptor's name (a symlink, a directory) is refused, not removed.
    """
    root = Path(root)
    name = descriptor_entry(check_token(root, mig_uuid, "MIG UUID"))
    uid = check_uid(root, uid)
    entry = container_entry(check_container(root, container))
    pod_path = root / uid
    path = pod_path / entry / name
    try:
        with fdops.open_root(root) as r, fdops.opened(r, r.fd, uid, pod_path) as pod_fd:
            with fdops.opened(r, pod_fd, entry, pod_path / entry) as cfd:
                removed = _unlink_regular(cfd, name, path)
            if fdops.rmdir_if_empty(pod_fd, entry, pod_path / entry):
                fdops.rmdir_if_empty(r.fd, uid, pod_path)
    except FileNotFoundError:
        return False
    return removed


def _unlink_regular(dir_fd: int, name: str, path: Path) -> bool:
    st = fdops.lstat_at(dir_fd, name)
    if st is None:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(path, "is not a regular file; leaving it in place")
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise WorkdirError(path, f"cannot remove: {exc.strerror}") from exc
    return True
