"""GC sweep: `python -m bench.gc_sweep [--pods 10000] [--live 9000] [--concurrency 64]`.

A real nats-server; a pods root with `--pods` Pod directories, each holding a partition descriptor
and an owned logical-slice tree (the worst case: every directory has something the GC could
delete, so every one costs a pods.get); `pods.get` and `claims.query` answered by minimal micro
services from a table in which `--live` Pods are live and the rest gone. Prints, in seconds:
the scan alone, the first sweep (asks about every Pod, collects the gone ones' slices and
announces them) and a second sweep (the steady state: only live Pods left to ask about).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import nats

from partkeeper import workdir
from partkeeper.bus import ensure_topology, serve
from partkeeper.bus.rpc import Endpoint
from partkeeper.config import Config
from partkeeper.stack.natsserver import NatsServer
from schemas import ClaimsQuery, ClaimsReply, PodsGet, PodsGetReply
from schemas.names import claims_query_subject, pods_get_subject
from services.gc.collect import Collector
from services.gc.sweep import CONCURRENCY, SweepStats, sweep_once


def populate(root: Path, uids: list[str]) -> None:
    """Write the trees directly (no fsync per file): setting up is not what is measured."""
    for uid in uids:
        container = root / uid / "c-main"
        sliced = container / workdir.SLICED
        (sliced / "cache").mkdir(parents=True)
        (container / f"partition-MIG-{uid}.json").write_bytes(b'{"card": 0}')
        (sliced / workdir.MARK).write_bytes(workdir.mark_body(uid, "main"))
        (sliced / "limits.json").write_bytes(json.dumps({"memory_mib": 10240}).encode())


async def answer_from(nc: nats.NATS, node: str, live: set[str]) -> None:
    async def pods_get(body: PodsGet) -> PodsGetReply:
        state = "live" if body.uid in live else "gone"
        return PodsGetReply(uid=body.uid, state=state, evidence="bench table")

    async def claims_query(body: ClaimsQuery) -> ClaimsReply:
        return ClaimsReply()

    await serve(nc, name="pk-watcher", version="0.0.0", description="bench",
                endpoints=[Endpoint("pods-get", pods_get_subject(node), PodsGet, pods_get)])
    await serve(nc, name="pk-allocator", version="0.0.0", description="bench",
                endpoints=[Endpoint("claims-query", claims_query_subject(node), ClaimsQuery,
                                    claims_query)])


def line(name: str, seconds: float, stats: SweepStats | None = None) -> str:
    text = f"{name:<28} {seconds:8.3f} s"
    if stats is not None:
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(stats.verdicts.items()))
        text += f"   dirs {stats.directories}, asked about {stats.candidates}: {verdicts}"
    return text


async def run(pods: int, live_count: int, concurrency: int, workdir_root: Path) -> None:
    (workdir_root / "nats").mkdir()
    server = NatsServer(store_dir=str(workdir_root / "nats")).start()
    node = "bench-node"
    root = workdir_root / "pods"
    uids = [str(uuid.uuid4()) for _ in range(pods)]
    live = set(uids[:live_count])
    await asyncio.to_thread(populate, root, uids)
    answers = await nats.connect(server.url)
    gc_nc = await nats.connect(server.url)
    try:
        await ensure_topology(gc_nc.jetstream())
        await answer_from(answers, node, live)
        collector = Collector(Config(nats_urls=(server.url,), node=node, pods_dir=root), gc_nc)
        started = time.perf_counter()
        scan = await asyncio.to_thread(workdir.scan_root, root)
        print(line(f"scan of {len(scan.pods)} dirs", time.perf_counter() - started))
        for name in ("first sweep", "second sweep"):
            started = time.perf_counter()
            stats = await sweep_once(collector, concurrency=concurrency)
            print(line(name, time.perf_counter() - started, stats))
        left = sum(1 for u in uids if (root / u / "c-main" / "sliced").exists())
        print(f"slices left: {left} (expected {live_count}); concurrency {concurrency}; "
              f"{os.cpu_count()} CPUs")
    finally:
        await gc_nc.drain()
        await answers.drain()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=9_000)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="pk-bench-gc-"))
    try:
        asyncio.run(run(args.pods, args.live, args.concurrency, top))
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
