"""Session fixtures: one real nats-server with JetStream per test session; task-leak check."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from partkeeper.bus import ensure_topology
from partkeeper.sim.apiserver import ApiServerThread, write_kubeconfig
from partkeeper.stack.natsserver import NatsServer


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    server = NatsServer().start()
    yield server
    server.stop()
    shutil.rmtree(server.store_dir, ignore_errors=True)


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    client = await nats.connect(nats_server.url)
    yield client
    await client.drain()


@pytest.fixture
async def js(nc: Client):
    jsc = nc.jetstream()
    await ensure_topology(jsc)
    return jsc


@pytest.fixture
def node(request: pytest.FixtureRequest) -> str:
    """A node name unique to the test, so tests share one server without sharing subjects."""
    return f"node-{uuid.uuid4().hex[:10]}.test"


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks of its own running."""
    before = set(asyncio.all_tasks())
    yield
    current = asyncio.current_task()
    leaked = [
        t for t in asyncio.all_tasks() - before
        if t is not current and not t.done() and not _is_library_task(t)
    ]
    if leaked and not os.environ.get("PK_ALLOW_TASK_LEAKS"):
        for task in leaked:
            task.cancel()
        names = [(t.get_name(), t.get_coro()) for t in leaked]
        pytest.fail(f"test left {len(leaked)} task(s) running: {names}")


def _is_library_task(task: asyncio.Task[object]) -> bool:
    coro = getattr(task.get_coro(), "__qualname__", "")
    library = ("Client.", "Subscription.", "_read_loop", "_flusher", "_JSI.")
    return any(part in coro for part in library)


@pytest.fixture
def apiserver() -> Iterator[ApiServerThread]:
    """A simulated API server per test. Bookmarks every 50 ms, so bookmark tests and stopping
    watch threads wait milliseconds rather than the real minute."""
    server = ApiServerThread(bookmark_interval=0.05).start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(apiserver: ApiServerThread, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
