"""Fixtures, one per real component: the nats-server with JetStream (one per session), the
simulated API server and its kubeconfig, the watcher in-process and as a process, the fake NVML
library (built once: a process loads one libnvidia-ml.so.1); and the task-leak check."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from partkeeper.bus import ensure_topology
from partkeeper.bus.permissions import ADMIN, inbox_prefix
from partkeeper.config import Config
from partkeeper_sim.apiserver import ApiServerThread, write_kubeconfig
from partkeeper_sim.stack.natsserver import NatsServer
from schemas.names import encode_token, pods_filter
from services.watcher.main import serve
from services.watcher.tuning import Tuning
from tests_support import until
from tests_support.watcher import FAST, Published, RunningWatcher, WatcherProcess, spawn_watcher


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    """One server for the session, provisioned (streams and buckets) as a deployment's is before
    any service starts: services only check that the topology exists."""
    server = NatsServer().start()
    asyncio.run(_provisioned(server.url))
    yield server
    server.stop()
    shutil.rmtree(server.store_dir, ignore_errors=True)


async def _provisioned(url: str) -> None:
    client = await nats.connect(url)
    try:
        await ensure_topology(client.jetstream())
    finally:
        await client.close()


@pytest.fixture(scope="session")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libnvidia-ml.so.1 of tests/fakes/nvml; see FakeNvml.create for a card state."""
    from fakes import nvml

    return nvml.build(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture(scope="session")
def hgml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libhgml.so of tests/fakes/hgml; see FakeHgml.create for a card state."""
    from fakes import hgml

    return hgml.build(tmp_path_factory.mktemp("fake-hgml"))


@pytest.fixture(scope="session")
def dmi_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libhydmi_mig.so.1 of tests/fakes/dmi; see FakeDmi.create for a card state."""
    from fakes import dmi

    return dmi.build(tmp_path_factory.mktemp("fake-dmi"))


@pytest.fixture
async def nc(nats_server: NatsServer, node: str) -> AsyncIterator[Client]:
    """An operator's connection: its inbox is `node`'s admin inbox, the one reply subject
    (besides the services' own inboxes) that the services answer (bus/rpc.py)."""
    client = await nats.connect(nats_server.url,
                                inbox_prefix=inbox_prefix(ADMIN, encode_token(node)))
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


@pytest.fixture
def watcher_config(nats_server: NatsServer, node: str, kubeconfig: Path) -> Config:
    return Config(nats_urls=(nats_server.url,), node=node, kubeconfig=str(kubeconfig))


@pytest.fixture
async def start_watcher(
    nc: Client, js: object, watcher_config: Config, apiserver: ApiServerThread
) -> AsyncIterator[Callable[..., Any]]:
    """Start the watcher in-process (as the embedded stack does) and wait until it is ready and
    its watch is open (so a test that stalls the watch stalls it); all are stopped at the end."""
    running: list[RunningWatcher] = []

    async def start(tuning: Tuning = FAST, *, wait_ready: bool = True) -> RunningWatcher:
        ready = asyncio.Event()
        task = asyncio.create_task(serve(watcher_config, nc, ready=ready, tuning=tuning),
                                   name="watcher")
        watcher = RunningWatcher(task, ready)
        running.append(watcher)
        if wait_ready:
            waiter = asyncio.create_task(ready.wait())
            done, _ = await asyncio.wait(
                {task, waiter}, timeout=15, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            if task in done:
                task.result()
            assert ready.is_set(), "the watcher did not become ready within 15s"
            await until(lambda: apiserver.open_watches() > 0, "the watcher's watch", 10)
        return watcher

    yield start
    for watcher in running:
        await watcher.stop()


@pytest.fixture
async def watcher_process(
    nats_server: NatsServer, node: str, kubeconfig: Path, tmp_path: Path
) -> AsyncIterator[Callable[..., Any]]:
    """Start `python -m services.watcher` with extra environment; every one still running at
    the end is killed."""
    started: list[WatcherProcess] = []

    async def start(**env: str) -> WatcherProcess:
        process = await spawn_watcher(
            nats_url=nats_server.url, node=node, kubeconfig=kubeconfig,
            log=tmp_path / f"watcher-{len(started)}.log", env=env,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        await process.kill()


@pytest.fixture
async def published(js: Any, node: str) -> AsyncIterator[Published]:
    """Every Pod event on the node's subjects, with its headers, as the watcher publishes them."""
    seen = Published()
    sub = await js.subscribe(pods_filter(node), cb=seen.on_msg, ordered_consumer=True)
    yield seen
    await sub.unsubscribe()
