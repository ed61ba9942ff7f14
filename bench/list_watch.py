"""Reading Pods from the API server: the `kubernetes` client on threads vs aiohttp on the loop.

`python -m bench.list_watch [--pods N] [--rounds R]` starts the simulated API server as its own
process (so this process's CPU time is only the reader's), creates N Pods on one node, then reads
them R times each way, from a resourceVersion before the first create (the server replays N
ADDED events), and LISTs them:

- threads: `partkeeper.listwatch.WatchRequest`, what the watcher, the simulated kubelet and the
  demo use: `kubernetes.watch.Watch().stream` in a thread, each event handed to the event loop;
  the LIST through the client in a worker thread;
- aiohttp: the same requests with an aiohttp session on the event loop, each line decoded with
  `json.loads`, as an asyncio client (kubernetes_asyncio, kopf) does.

Reported per way: events per second through the watch and the reader's CPU time per 1000
events (median of the rounds), and the LIST's wall time. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes import client, config

from partkeeper.listwatch import WatchRequest, _Ended

NODE = "bench-node"
SELECTOR = f"spec.nodeName={NODE}"
WATCH_SECONDS = 120


def start_server(directory: Path) -> tuple[subprocess.Popen[str], str, Path]:
    kubeconfig = directory / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "partkeeper_sim.apiserver", "--kubeconfig", str(kubeconfig),
         "--history-limit", "1000000"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    return proc, url, kubeconfig


def create_pods(api: client.CoreV1Api, count: int) -> None:
    def create(i: int) -> None:
        body = {"metadata": {"name": f"p-{i}", "namespace": "default"},
                "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]}}
        api.create_namespaced_pod("default", body, _preload_content=False)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, range(count)))


async def watch_threads(api: client.CoreV1Api, version: str, count: int) -> tuple[float, float]:
    def call(**kwargs: Any) -> Any:
        return api.list_pod_for_all_namespaces(field_selector=SELECTOR, **kwargs)

    wall, cpu = time.perf_counter(), time.process_time()
    request = WatchRequest(call, version, timeout_seconds=WATCH_SECONDS,
                           request_timeout=(10.0, 30.0)).start()
    seen = 0
    try:
        while seen < count:
            item = await request.next()
            if isinstance(item, _Ended):
                raise RuntimeError(f"the watch ended after {seen} events: {item.error}")
            event, _ = item  # (the event, when it was read)
            if event is not None and event.get("type") == "ADDED":
                seen += 1
    finally:
        request.stop()
    return time.perf_counter() - wall, time.process_time() - cpu


async def watch_aiohttp(url: str, version: str, count: int) -> tuple[float, float]:
    params = {"watch": "true", "resourceVersion": version, "allowWatchBookmarks": "true",
              "timeoutSeconds": str(WATCH_SECONDS), "fieldSelector": SELECTOR}
    wall, cpu = time.perf_counter(), time.process_time()
    seen = 0
    async with aiohttp.ClientSession() as session, \
            session.get(f"{url}/api/v1/pods", params=params) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.strip():
                continue
            if json.loads(line).get("type") == "ADDED":
                seen += 1
                if seen == count:
                    break
    return time.perf_counter() - wall, time.process_time() - cpu


async def list_threads(api: client.CoreV1Api) -> float:
    wall = time.perf_counter()
    resp = await asyncio.to_thread(api.list_pod_for_all_namespaces, field_selector=SELECTOR,
                                   _preload_content=False)
    json.loads(resp.data)
    return time.perf_counter() - wall


async def list_aiohttp(url: str) -> float:
    wall = time.perf_counter()
    async with aiohttp.ClientSession() as session, \
            session.get(f"{url}/api/v1/pods", params={"fieldSelector": SELECTOR}) as resp:
        json.loads(await resp.read())
    return time.perf_counter() - wall


async def measure(pods: int, rounds: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="pkbench") as tmp:
        proc, url, kubeconfig = start_server(Path(tmp))
        api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
        try:
            before = api.list_pod_for_all_namespaces(_preload_content=False)
            version = json.loads(before.data)["metadata"]["resourceVersion"]
            await asyncio.to_thread(create_pods, api, pods)
            results: dict[str, list[tuple[float, float]]] = {"threads": [], "aiohttp": []}
            lists: dict[str, list[float]] = {"threads": [], "aiohttp": []}
            for _ in range(rounds):
                results["threads"].append(await watch_threads(api, version, pods))
                results["aiohttp"].append(await watch_aiohttp(url, version, pods))
                lists["threads"].append(await list_threads(api))
                lists["aiohttp"].append(await list_aiohttp(url))
        finally:
            api.api_client.close()
            proc.terminate()
            proc.wait(10)
    lines = [f"{pods} Pods, {rounds} rounds, median:"]
    for way, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        lines.append(f"  {way:8} watch {pods / wall:8.0f} events/s, "
                     f"CPU {1000 * cpu / pods * 1000:6.1f} ms per 1000 events; "
                     f"LIST {1000 * statistics.median(lists[way]):6.1f} ms")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.list_watch", description=__doc__)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for line in asyncio.run(measure(args.pods, args.rounds)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
