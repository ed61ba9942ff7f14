"""Helpers of the observability tests: the watcher as a process, Pod events with their headers,
waiting for a consumer to acknowledge, scraping /metrics. Every wait has a deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client.parser import text_string_to_metric_families

from schemas import PodEvent, decode

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 20.0


class WatcherProcess:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    async def terminate(self, timeout: float = DEADLINE) -> int:
        """SIGTERM and wait for the exit (the clean path: spans flushed, NATS drained)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"the watcher did not exit within {timeout}s; "
                                 f"log:\n{self.tail()}") from None

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def spawn_watcher(
    *, nats_url: str, node: str, kubeconfig: Path, log: Path, env: dict[str, str]
) -> WatcherProcess:
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "PK_NODE_NAME": node,
        "NATS_URL": nats_url,
        "KUBECONFIG": str(kubeconfig),
        "PK_METRICS_PORT": "0",
        **env,
    }
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.watcher", cwd=ROOT, env=full,
            stdout=out, stderr=out,
        )
    return WatcherProcess(proc, log)


@dataclass
class Captured:
    """Pod events on the node's subjects with their headers, in stream order."""

    events: list[tuple[PodEvent, dict[str, str]]] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def on_msg(self, msg: Msg) -> None:
        event = decode(msg.data, PodEvent, what="pod event")
        async with self.changed:
            self.events.append((event, dict(msg.headers or {})))
            self.changed.notify_all()

    def of(self, uid: str, kind: str) -> list[tuple[PodEvent, dict[str, str]]]:
        return [(e, h) for e, h in self.events if e.uid == uid and type(e).__name__ == kind]

    async def wait_for(self, uid: str, kind: str, timeout: float = DEADLINE) -> dict[str, str]:
        """The headers of the first `kind` event of `uid`, waiting for it."""
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: self.of(uid, kind)),
                                       timeout)
            except TimeoutError:
                raise AssertionError(f"no {kind} of {uid} within {timeout}s") from None
            return self.of(uid, kind)[0][1]


async def acknowledged(js: JetStreamContext, stream: str, durable: str, seq: int) -> bool:
    """Whether the consumer has been delivered stream sequence `seq` and acknowledged all."""
    try:
        info = await js.consumer_info(stream, durable)
    except NotFoundError:
        return False
    delivered = info.delivered.stream_seq if info.delivered else 0
    return (delivered or 0) >= seq and info.num_ack_pending == 0 and info.num_pending == 0


async def until_true(check: Callable[[], Any], timeout: float = DEADLINE, what: str = "") -> None:
    """Re-run the async `check` until it is truthy; fail with `what` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(0.05)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics on 127.0.0.1:`port`: sample (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples
