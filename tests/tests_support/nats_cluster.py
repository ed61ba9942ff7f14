"""Three nats-server processes forming one JetStream cluster on loopback ports.

Each server gets a small config file (its name, the cluster routes to all three, a monitoring
port); `NatsServer` adds `-js`, the client port and the store. The JetStream meta leader is read
from any server's monitoring endpoint `/jsz` (`meta_cluster.leader`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import nats
import nats.errors
from nats.js import JetStreamContext

from partkeeper.bus import ensure_topology
from partkeeper_sim.stack.natsserver import NatsServer, free_port
from tests_support import until

CLUSTER_NAME = "pk-test"
SIZE = 3
TOPOLOGY_SECONDS = 60.0


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.names = [f"n{i}" for i in range(SIZE)]
        self._configure()

    def _configure(self) -> None:
        """New free ports for every server (client, route, monitoring) and their config files."""
        root = self.root
        routes = [free_port() for _ in range(SIZE)]
        self.monitors = [free_port() for _ in range(SIZE)]
        self.servers: list[NatsServer] = []
        for i, name in enumerate(self.names):
            store = root / name
            store.mkdir(parents=True, exist_ok=True)
            config = store / "server.conf"
            others = ", ".join(f'"nats://127.0.0.1:{p}"' for j, p in enumerate(routes) if j != i)
            config.write_text(
                f'server_name: "{name}"\n'
                f'http: "127.0.0.1:{self.monitors[i]}"\n'
                f'cluster {{\n  name: "{CLUSTER_NAME}"\n  listen: "127.0.0.1:{routes[i]}"\n'
                f'  routes: [{others}]\n}}\n'
            )
            self.servers.append(NatsServer(str(store), config=str(config)))

    @property
    def url(self) -> str:
        return ",".join(s.url for s in self.servers)

    def jsz(self, index: int) -> dict[str, object]:
        url = f"http://127.0.0.1:{self.monitors[index]}/jsz"
        with urllib.request.urlopen(url, timeout=2) as resp:
            body: dict[str, object] = json.loads(resp.read())
        return body

    def leader(self) -> int | None:
        """The index of the JetStream meta leader, as the running servers see it (None: no
        leader now, or the servers disagree)."""
        seen = set()
        for i, server in enumerate(self.servers):
            if server.proc is None:
                continue
            try:
                meta = self.jsz(i).get("meta_cluster") or {}
            except (OSError, urllib.error.URLError, ValueError):
                return None
            seen.add(str(meta.get("leader", "")) if isinstance(meta, dict) else "")
        if len(seen) != 1 or "" in seen:
            return None
        name = seen.pop()
        return self.names.index(name) if name in self.names else None

    async def wait_leader(self, timeout: float = 60.0, other_than: int | None = None) -> int:
        elected: list[int] = []

        async def found() -> bool:
            index = await asyncio.to_thread(self.leader)
            if index is None or index == other_than:
                return False
            elected.append(index)
            return True

        await until(found, f"a JetStream meta leader; see {[s.log_path for s in self.servers]}",
                    timeout)
        return elected[0]

    async def start(self, replicas: int = SIZE) -> None:
        """Start the servers, wait for a meta leader, and create the streams and buckets with
        `replicas` (as an operator would before the agents run: a fresh cluster may still time
        out the first stream creations, which ends a starting service)."""
        await self._start_servers()
        await self.wait_leader()
        nc = await nats.connect(self.url.split(","))
        try:
            end = time.monotonic() + TOPOLOGY_SECONDS
            while True:
                try:
                    await ensure_topology(nc.jetstream(), replicas=replicas)
                    return
                except nats.errors.Error:
                    if time.monotonic() > end:
                        raise
                    await asyncio.sleep(0.5)  # the cluster is still electing stream leaders
        finally:
            await nc.close()

    async def _start_servers(self, attempts: int = 3) -> None:
        """A free port can be taken by another process between its choice and the server's
        bind (the server then exits at once): start again on new ports, a few times."""
        for attempt in range(1, attempts + 1):
            started = await asyncio.gather(*(asyncio.to_thread(s.start) for s in self.servers),
                                           return_exceptions=True)
            failed = [r for r in started if isinstance(r, BaseException)]
            if not failed:
                return
            await self.stop()
            if attempt == attempts:
                raise failed[0]
            self._configure()

    async def kill(self, index: int) -> None:
        """SIGKILL: the server gets no chance to hand its leadership over."""
        proc = self.servers[index].proc
        if proc is not None:
            proc.kill()
            await asyncio.to_thread(proc.wait)
        self.servers[index].proc = None

    async def restart(self, index: int, *, empty: bool = False) -> None:
        """Start a killed server again on its port, with its store or (`empty`) without."""
        server = self.servers[index]
        if server.proc is not None:
            await self.kill(index)
        if empty:
            shutil.rmtree(Path(server.store_dir) / "jetstream", ignore_errors=True)
        await asyncio.to_thread(server.start)

    async def stream_leader(self, js: JetStreamContext, stream: str) -> int | None:
        """The index of the server leading `stream` now (None: no leader, or not answerable)."""
        try:
            info = await js.stream_info(stream)
        except (TimeoutError, nats.errors.Error):
            return None
        leader = info.cluster.leader if info.cluster else None
        return self.names.index(leader) if leader in self.names else None

    async def wait_stream_leader(self, js: JetStreamContext, stream: str, *, other_than: int,
                                 timeout: float = 60.0) -> int:
        elected: list[int] = []

        async def found() -> bool:
            index = await self.stream_leader(js, stream)
            if index is None or index == other_than:
                return False
            elected.append(index)
            return True

        await until(found, f"a new leader of {stream}", timeout)
        return elected[0]

    async def wait_current(self, js: JetStreamContext, streams: list[str],
                           timeout: float = 120.0) -> None:
        """Every replica of every stream is current again (a restarted server caught up)."""
        async def current(stream: str) -> bool:
            try:
                info = await js.stream_info(stream)
            except (TimeoutError, nats.errors.Error):
                return False
            replicas = (info.cluster.replicas or []) if info.cluster else []
            return bool(info.cluster and info.cluster.leader and len(replicas) == SIZE - 1
                        and all(r.current and not r.offline for r in replicas))

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for stream in streams:
            await until(functools.partial(current, stream), f"every replica of {stream} current",
                        max(0.0, deadline - loop.time()))

    async def stop(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(s.stop) for s in self.servers))


def cluster_root() -> Path:
    return Path(tempfile.mkdtemp(prefix="pk-nats-cluster-"))


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
