"""The watcher as a process (`python -m services.watcher`), stopped and killed, then restarted:
nothing is forgotten and nothing announced twice (invariant 6)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from partkeeper.faults import EXIT_STATUS
from partkeeper.sim.apiserver import ApiServerThread
from partkeeper.stack.natsserver import NatsServer
from schemas import PodGone
from tests_support.kubeclient import pod_manifest
from tests_support.watcher import Published

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 20.0


class WatcherProcess:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    async def exited(self, timeout: float = DEADLINE) -> int:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"the watcher did not exit within {timeout}s; "
                                 f"log:\n{self.log.read_text()[-3000:]}") from None

    async def terminate(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.exited()


@pytest.fixture
async def spawn(
    nats_server: NatsServer, node: str, kubeconfig: Path, tmp_path: Path
) -> AsyncIterator[Callable[..., Any]]:
    started: list[WatcherProcess] = []

    async def start(faults: str = "") -> WatcherProcess:
        env = {
            **os.environ,
            "PK_NODE_NAME": node,
            "NATS_URL": nats_server.url,
            "KUBECONFIG": str(kubeconfig),
            "PK_METRICS_PORT": "0",
            "PK_FAULTS": faults,
        }
        log = tmp_path / f"watcher-{len(started)}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "services.watcher", cwd=ROOT, env=env,
                stdout=out, stderr=out,
            )
        process = WatcherProcess(proc, log)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.proc.returncode is None:
            process.proc.kill()
            await process.proc.wait()


async def test_a_pod_deleted_while_the_watcher_was_down_is_announced_gone_after_restart(
    apiserver: ApiServerThread, spawn: Any, published: Published, node: str
) -> None:
    doomed = apiserver.create_pod(pod_manifest("doomed", node=node))["metadata"]["uid"]
    stays = apiserver.create_pod(pod_manifest("stays", node=node))["metadata"]["uid"]
    first = await spawn()
    await published.wait_for(doomed, "PodSeen", timeout=DEADLINE)
    await published.wait_for(stays, "PodSeen", timeout=DEADLINE)
    assert await first.terminate() == 0
    apiserver.delete_pod("default", "doomed", grace_period_seconds=0)
    second = await spawn()
    await published.wait_for(doomed, "PodGone", timeout=DEADLINE)
    (gone,) = published.of(doomed, "PodGone")
    assert isinstance(gone, PodGone) and gone.evidence == "relist"
    # The relist applies the listed Pods before the absent ones: "stays" was re-observed by now,
    # and the persisted view made that a no-op.
    assert len(published.of(stays)) == 1
    assert await second.terminate() == 0


async def test_killed_before_each_publish_the_restart_publishes_each_fact_once(
    apiserver: ApiServerThread, spawn: Any, published: Published, node: str
) -> None:
    uid = apiserver.create_pod(pod_manifest("a", node=node))["metadata"]["uid"]
    crashing = await spawn("watcher.before_publish=exit")
    assert await crashing.exited() == EXIT_STATUS
    assert not published.events
    healthy = await spawn()
    await published.wait_for(uid, "PodSeen", timeout=DEADLINE)
    assert await healthy.terminate() == 0
    apiserver.delete_pod("default", "a", grace_period_seconds=0)
    crashing = await spawn("watcher.before_publish=exit")
    assert await crashing.exited() == EXIT_STATUS
    healthy = await spawn()
    await published.wait_for(uid, "PodGone", timeout=DEADLINE)
    assert [type(e).__name__ for e in published.of(uid)] == ["PodSeen", "PodGone"]
    assert await healthy.terminate() == 0
