"""Fixtures for the working-directory and GC tests: a pods root, a tree outside it, a tmpfs,
the test doubles answering pods.get and claims.query, and the GC itself."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from partkeeper.bus.permissions import inbox_prefix
from partkeeper.config import Config
from partkeeper_sim.stack.natsserver import NatsServer
from schemas.names import encode_token
from services.gc import main as gc_main
from tests_support.gc import FakeAllocator, FakeWatcher

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



# --- answering pods.get and claims.query: test-only micro services over real NATS ----------------


@pytest.fixture
async def watcher(nc: Client, node: str) -> AsyncIterator[FakeWatcher]:
    fake = await FakeWatcher(nc, node).start()
    yield fake
    await fake.stop()


@pytest.fixture
async def allocator(nc: Client, node: str) -> AsyncIterator[FakeAllocator]:
    fake = await FakeAllocator(nc, node).start()
    yield fake
    await fake.stop()


# --- the GC under test --------------------------------------------------------------------------

SWEEP_SECONDS = 0.1


@pytest.fixture
def gc_config(nats_server: NatsServer, node: str, root: Path) -> Config:
    return Config(
        nats_urls=(nats_server.url,), node=node, pods_dir=root, resync_seconds=SWEEP_SECONDS
    )


StartGc = Callable[..., Awaitable[None]]


@pytest.fixture
async def start_gc(nats_server: NatsServer, gc_config: Config) -> AsyncIterator[StartGc]:
    """Start the GC in-process on its own connection; stopped at teardown."""
    running: list[tuple[asyncio.Task[None], Client]] = []

    async def start(**kwargs: Any) -> None:
        client = await nats.connect(
            nats_server.url, inbox_prefix=inbox_prefix("gc", encode_token(gc_config.node)))
        ready = asyncio.Event()
        task = asyncio.create_task(gc_main.serve(gc_config, client, ready=ready, **kwargs))
        running.append((task, client))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiter}, timeout=15, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            task.result()
        assert ready.is_set(), "the GC did not become ready"

    yield start
    for task, client in running:
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=10)
        await client.drain()
        assert done, "the GC did not stop within 10s of being cancelled"
        if not task.cancelled():
            task.result()  # a GC that crashed fails the test that ran it
