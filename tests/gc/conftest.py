"""Fixtures for the working-directory and GC tests: a pods root, a tree outside it, a tmpfs."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from partkeeper import workdir

SENTINEL = b"outside data that must survive\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "pods"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the root, holding a file and a sliced-looking tree with a valid mark."""
    out = tmp_path / "outside"
    (out / "cache").mkdir(parents=True)
    (out / "precious.txt").write_bytes(SENTINEL)
    (out / "cache" / "blob").write_bytes(SENTINEL)
    return out


@pytest.fixture
def outside_intact(outside: Path) -> Callable[[], bool]:
    def check() -> bool:
        return (outside / "precious.txt").read_bytes() == SENTINEL and (
            outside / "cache" / "blob"
        ).read_bytes() == SENTINEL

    return check


@pytest.fixture
def uid() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def new_uid() -> Callable[[], str]:
    return lambda: str(uuid.uuid4())


MakePod = Callable[..., Path]


@pytest.fixture
def make_pod() -> MakePod:
    return build_pod


def build_pod(
    root: Path, uid: str, *, descriptor: bool = True, sliced: bool = True, container: str = "main"
) -> Path:
    """A Pod directory as the allocator leaves it: a descriptor and/or an owned sliced tree."""
    if descriptor:
        workdir.write_descriptor(root, uid, container, f"MIG-{uid}", b'{"card": 0}')
    if sliced:
        sliced_dir = workdir.write_sliced(
            root, uid, container, {"limits.json": b'{"memory_mib": 1024}', "cuda.env": b"X=1"}
        )
        (sliced_dir / "cache" / "kernel.bin").write_bytes(b"cached by the workload")
        (sliced_dir / "cache" / "sub").mkdir()
        (sliced_dir / "cache" / "sub" / "more.bin").write_bytes(b"more")
    return root / uid


def _can_mount() -> bool:
    return os.geteuid() == 0 and os.path.exists("/proc/self/mountinfo")


@pytest.fixture
def mount_tmpfs() -> Iterator[Callable[[Path], Path]]:
    """Mount a small tmpfs at a directory (root only); skipped where mounting is not allowed."""
    mounted: list[Path] = []

    def mount(where: Path) -> Path:
        if not _can_mount():
            pytest.skip("mounting a tmpfs needs root")
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
            capture_output=True, text=True, check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def fake_device() -> Callable[..., workdir.DeviceOf]:
    return device_seam


def device_seam(*dirs: Path) -> workdir.DeviceOf:
    """A device seam: the given directories (by inode) report another filesystem."""
    inodes = {os.stat(d, follow_symlinks=False).st_ino for d in dirs}

    def device_of(st: os.stat_result) -> int:
        return st.st_dev + 1 if st.st_ino in inodes else st.st_dev

    return device_of
