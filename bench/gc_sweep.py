"""GC sweep: `python -m bench.gc_sweep [--pods 10000] [--live 9000] [--steady 3] [--profile]`.

A real nats-server; a pods root with `--pods` Pod directories, each holding a partition descriptor
and an owned logical-slice tree (the worst case: every directory has something the GC could
delete, so every one costs a question); `pods.states`, `pods.get` and `claims.query` answered by
minimal micro services from a table in which `--live` Pods are live and the rest gone. Prints, in
seconds: the first sweep (asks about every Pod, collects the gone ones' slices and announces
them), then `--steady` sweeps of the steady state (only live Pods left to ask about), each with
the Pod directories it read afresh and its bus round trips. Between sweeps it waits (untimed) the
scan cache's settle time, as the sweep period does in service.

The floor, measured in the same run on the same tree and nats-server: a bare `lstat` of every
directory and mark a listing rests on (what telling an unchanged tree from a changed one costs),
a bare scandir walk of the whole tree reading each mark (what reading it afresh costs), and a bare
NATS request/reply (p50 of 200). The steady sweep is printed beside its floor (the lstat walk plus
its round trips at the bare p50) as a ratio, and against the goal issue 27 states (< 1 s for
10,000 Pod dirs). `--profile` adds a cProfile of one steady sweep: the scan (in this thread, where
the os.* call counts are the syscalls) and the sweep's event loop (where the round trips are).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.msg import Msg

from partkeeper import workdir
from partkeeper.bus import ensure_topology, serve
from partkeeper.bus.permissions import inbox_prefix
from partkeeper.bus.rpc import Endpoint
from partkeeper.config import Config
from partkeeper_sim.stack.natsserver import NatsServer
from schemas import (
    ClaimsQuery,
    ClaimsReply,
    PodsGet,
    PodsGetReply,
    PodsStates,
    PodsStatesReply,
)
from schemas.names import claims_query_subject, encode_token, pods_get_subject, pods_states_subject
from schemas.pods import PodState
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
        state: PodState = "live" if body.uid in live else "gone"
        return PodsGetReply(uid=body.uid, state=state, evidence="bench table")

    async def pods_states(body: PodsStates) -> PodsStatesReply:
        return PodsStatesReply(pods=[await pods_get(PodsGet(uid=uid)) for uid in body.uids])

    async def claims_query(body: ClaimsQuery) -> ClaimsReply:
        return ClaimsReply()

    await serve(nc, name="pk-watcher", version="0.0.0", description="bench",
                endpoints=[Endpoint("pods-get", pods_get_subject(node), PodsGet, pods_get),
                           Endpoint("pods-states", pods_states_subject(node), PodsStates,
                                    pods_states)])
    await serve(nc, name="pk-allocator", version="0.0.0", description="bench",
                endpoints=[Endpoint("claims-query", claims_query_subject(node), ClaimsQuery,
                                    claims_query)])


GOAL_SECONDS = 1.0  # issue 27: GC steady sweep, 10,000 Pod dirs, < 1 s
ECHO = "bench.gc.echo"


def line(name: str, seconds: float, stats: SweepStats | None = None) -> str:
    text = f"{name:<28} {seconds:8.3f} s"
    if stats is not None:
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(stats.verdicts.items()))
        text += (f"   dirs {stats.directories} ({stats.read} read afresh), asked about "
                 f"{stats.candidates} in {stats.round_trips} round trips: {verdicts}")
    return text


def lstat_walk(root: Path) -> int:
    """The floor of telling an unchanged tree from a changed one: one lstat per directory a
    listing rests on and per mark, by path from the root's fd, and nothing else."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    count = 0
    try:
        for pod in os.listdir(fd):
            paths = [pod, f"{pod}/c-main", f"{pod}/c-main/{workdir.SLICED}",
                     f"{pod}/c-main/{workdir.SLICED}/{workdir.MARK}"]
            for path in paths:
                os.stat(path, dir_fd=fd, follow_symlinks=False)
                count += 1
    finally:
        os.close(fd)
    return count


def scandir_walk(root: Path) -> int:
    """The floor of reading the tree afresh: scandir of every directory down to `sliced/`, and
    each mark read, with nothing decided."""
    count = 0
    with os.scandir(root) as pods:
        for pod in pods:
            with os.scandir(pod.path) as containers:
                for container in containers:
                    with os.scandir(container.path) as entries:
                        for entry in entries:
                            count += 1
                            if entry.name == workdir.SLICED:
                                with os.scandir(entry.path) as sliced:
                                    count += sum(1 for _ in sliced)
                                with open(os.path.join(entry.path, workdir.MARK), "rb") as f:
                                    f.read(4097)
    return count


async def bare_round_trip(nc: nats.NATS, responder: nats.NATS, n: int = 200) -> float:
    """p50 of a bare NATS request/reply, in seconds, on the same server as the sweep."""
    async def echo(msg: Msg) -> None:
        await msg.respond(b"ok")

    sub = await responder.subscribe(ECHO, cb=echo)
    await responder.flush()
    for attempt in range(10):  # the server can take a moment to route a new interest
        try:
            await nc.request(ECHO, b"ping", timeout=2.0)
            break
        except nats.errors.NoRespondersError:
            await asyncio.sleep(0.05 * (attempt + 1))
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await nc.request(ECHO, b"ping", timeout=2.0)
        samples.append(time.perf_counter() - started)
    await sub.unsubscribe()
    return statistics.median(samples)


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def top(profile: cProfile.Profile, n: int = 14) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(n)
    return "\n".join(x for x in out.getvalue().splitlines() if x.strip())


def syscalls(profile: cProfile.Profile) -> str:
    """ncalls of the os.* and posix builtins: one syscall each (listdir: an open, a close and
    getdents until empty)."""
    raw: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]  # pstats keeps it untyped
    calls = {f"{fn}": c[1] for (_, _, fn), c in raw.items()
             if any(f"{k}" in fn for k in ("posix.", "<built-in method posix", "os.")) and
             not fn.startswith("<method")}
    calls = {k.replace("<built-in method posix.", "").rstrip(">").replace("}", ""): v
             for k, v in calls.items()}
    return ", ".join(f"{k} {v}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1]))


async def run(pods: int, live_count: int, concurrency: int, steady: int, profile: bool,
              workdir_root: Path) -> None:
    (workdir_root / "nats").mkdir()
    server = NatsServer(store_dir=str(workdir_root / "nats")).start()
    node = "bench-node"
    root = workdir_root / "pods"
    uids = [str(uuid.uuid4()) for _ in range(pods)]
    live = set(uids[:live_count])
    await asyncio.to_thread(populate, root, uids)
    answers = await nats.connect(server.url)
    # the GC's own inbox: the answering services reply to their node's inboxes only
    gc_nc = await nats.connect(server.url, inbox_prefix=inbox_prefix("gc", encode_token(node)))
    try:
        await ensure_topology(gc_nc.jetstream())
        await answer_from(answers, node, live)
        config = Config(nats_urls=(server.url,), node=node, pods_dir=root)
        collector = Collector(config, gc_nc)
        # The tree was just written: let its ctimes settle, or the first sweeps keep nothing.
        await asyncio.sleep(workdir.cache.SETTLE_SECONDS)
        rt = await bare_round_trip(gc_nc, answers)
        walk_s, walked = await asyncio.to_thread(timed, lambda: scandir_walk(root))
        lstat_s, lstats = await asyncio.to_thread(timed, lambda: lstat_walk(root))
        print(f"floor: bare NATS request/reply p50 {rt * 1000:.3f} ms; bare lstat walk "
              f"({lstats} lstats) {lstat_s:.3f} s; bare scandir walk reading each mark "
              f"({walked} entries) {walk_s:.3f} s")
        started = time.perf_counter()
        stats = await sweep_once(collector, concurrency=concurrency)
        print(line("first sweep", time.perf_counter() - started, stats))
        times: list[float] = []
        for n in range(1, steady + 1):
            # Untimed: sweeps are PK_RESYNC_SECONDS (10 s) apart in service, longer than the
            # settle time, so what the previous sweep changed can be kept (workdir.cache).
            await asyncio.sleep(workdir.cache.SETTLE_SECONDS)
            started = time.perf_counter()
            stats = await sweep_once(collector, concurrency=concurrency)
            took = time.perf_counter() - started
            times.append(took)
            floor = lstat_s + stats.round_trips * rt
            print(line(f"steady sweep {n}", took, stats)
                  + f"; floor {floor:.3f} s, {took / floor:.1f}x")
        left = sum(1 for u in uids if (root / u / "c-main" / "sliced").exists())
        print(f"slices left: {left} (expected {live_count}); concurrency {concurrency}; "
              f"{os.cpu_count()} CPUs")
        if times:
            best = min(times)
            verdict = "met" if pods >= 10_000 and best < GOAL_SECONDS else (
                "not met" if pods >= 10_000 else f"not judged ({pods} Pod dirs)")
            print(f"steady sweep median {statistics.median(times):.3f} s, best {best:.3f} s; "
                  f"goal (issue 27: GC steady sweep of 10,000 Pod dirs < 1 s): {verdict}")
        if profile:
            await print_profile(collector, concurrency)
    finally:
        await gc_nc.drain()
        await answers.drain()
        server.stop()


async def print_profile(collector: Collector, concurrency: int) -> None:
    scan = cProfile.Profile()
    scan.runcall(workdir.scan_root, collector.root, cache=collector.scan_cache)
    print("profile of a steady scan (this thread):")
    print(f"  syscalls: {syscalls(scan)}")
    print(top(scan))
    loop = cProfile.Profile()
    loop.enable()
    stats = await sweep_once(collector, concurrency=concurrency)
    loop.disable()
    print(f"profile of a steady sweep (event loop thread; the scan runs in a worker): "
          f"{stats.round_trips} round trips")
    print(top(loop))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=9_000)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--steady", type=int, default=3, help="steady sweeps after the first")
    parser.add_argument("--profile", action="store_true", help="cProfile one more steady sweep")
    args = parser.parse_args()
    where = Path(tempfile.mkdtemp(prefix="pk-bench-gc-"))
    try:
        asyncio.run(run(args.pods, args.live, args.concurrency, args.steady, args.profile, where))
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
