"""A fleet on one NATS cluster: `python -m bench.fleet --nodes 50,200 [--layout r1|r3]`.

Plays N nodes' bus traffic against a local 3-server JetStream cluster with the project's own
streams and buckets (`ensure_topology`, 3 replicas), as a fleet of N nodes would:

- per node the three durable consumers the services create (reclaimer and GC on
  `pk.pods.<node>.*`, the watcher's Event recorder on `pk.parts.<node>.*`), each fetched,
  handled and acknowledged by a pull loop as `ConsumerRunner` does;
- per node one Pod cycle every `--cycle` seconds (staggered): PodSeen, PodFinished, PodGone on
  PK_PODS; claim creating/active/releasing/removed on PK_PARTITIONS, each after a CAS write of the
  card's claims document in pk-claims; a capacity document put; a `pods.get` request answered by a
  per-node micro-style responder.

`--layout` chooses how the durables are stored: `r1` (what the services create,
`ConsumerSpec.replicas`: one replica, file storage, the consumer's state on one server while its
stream stays R3) or `r3` (the consumer inherits its stream's 3 replicas: one raft group each).

Reported: server memory (RSS from `/varz`), streams and consumers (the account's JetStream
info) and raft groups (one meta group, one per R3 stream, one per R3 consumer),
publish -> deliver p50/p99 (stamped at publish, read when fetched), consumer lag p99 (publish ->
acknowledged: how far behind the stream its reader is, in time), KV CAS p50/p99, `pods.get`
p50/p99, and the start-up of one more node (connect, topology, its three durables, its claims and
Pod view read, its endpoint answering) against the cluster serving the N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from bench.figures import Latency
from partkeeper.bus import ensure_topology
from partkeeper.bus.kv import Bucket, entries
from schemas.names import (
    BUCKET_CAPACITY,
    BUCKET_CLAIMS,
    BUCKET_PODS,
    STREAM_PARTITIONS,
    STREAM_PODS,
    claims_key,
    durable_name,
    parts_filter,
    parts_subject,
    pods_filter,
    pods_get_subject,
    pods_subject,
)
from tests_support.nats_cluster import Cluster, cluster_root, remove

CARDS = 2
SENT = "Pk-Bench-Sent"
CREATE_CONCURRENCY = 32


async def tick(samples: Samples) -> None:
    """How late this process's event loop runs a 50 ms sleep: its own share of any latency."""
    while True:
        started = time.monotonic()
        await asyncio.sleep(0.05)
        samples.loop.append(time.monotonic() - started - 0.05)


@dataclass
class Samples:
    deliver: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    cas: list[float] = field(default_factory=list)
    request: list[float] = field(default_factory=list)
    loop: list[float] = field(default_factory=list)
    errors: int = 0
    published: int = 0
    delivered: int = 0


def consumer_configs(node: str, layout: str) -> list[tuple[str, api.ConsumerConfig]]:
    replicas = 1 if layout == "r1" else 0  # 0: the stream's own
    made = []
    for stream, durable, subject in (
        (STREAM_PODS, durable_name("reclaimer", node), pods_filter(node)),
        (STREAM_PODS, durable_name("gc", node), pods_filter(node)),
        (STREAM_PARTITIONS, durable_name("watcher-events", node, STREAM_PARTITIONS),
         parts_filter(node)),
    ):
        made.append((stream, api.ConsumerConfig(
            durable_name=durable, name=durable, filter_subject=subject,
            ack_policy=api.AckPolicy.EXPLICIT, deliver_policy=api.DeliverPolicy.NEW,
            ack_wait=30, max_deliver=-1, max_ack_pending=1000, num_replicas=replicas or None,
        )))
    return made


async def bounded(jobs: list[Callable[[], Awaitable[None]]], limit: int) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(one(j) for j in jobs))


async def create_consumers(js: JetStreamContext, nodes: list[str], layout: str) -> None:
    jobs: list[Callable[[], Awaitable[None]]] = []
    for node in nodes:
        for stream, config in consumer_configs(node, layout):
            async def add(stream: str = stream, config: api.ConsumerConfig = config) -> None:
                problem: Exception | None = None
                for _ in range(20):
                    try:
                        await js.add_consumer(stream, config=config, timeout=10)
                        return
                    except (TimeoutError, nats.errors.Error) as exc:
                        problem = exc
                        await asyncio.sleep(0.5)  # the cluster is busy; again
                raise RuntimeError(f"could not create {config.durable_name}: {problem}")
            jobs.append(add)
    await bounded(jobs, CREATE_CONCURRENCY)


async def consume(js: JetStreamContext, stream: str, durable: str, samples: Samples) -> None:
    sub = await js.pull_subscribe_bind(durable=durable, stream=stream)
    while True:
        try:
            msgs = await sub.fetch(1, timeout=5.0)  # as ConsumerRunner pulls
        except (TimeoutError, nats.errors.TimeoutError):
            continue
        except nats.errors.Error:
            samples.errors += 1
            await asyncio.sleep(0.5)
            continue
        for msg in msgs:
            sent = float((msg.headers or {}).get(SENT, "0"))
            samples.deliver.append(time.time() - sent)
            try:
                await msg.ack_sync()
            except (TimeoutError, nats.errors.Error):
                samples.errors += 1
                continue
            samples.lag.append(time.time() - sent)
            samples.delivered += 1


async def responder(nc: Client, node: str) -> None:
    async def answer(msg: Msg) -> None:
        await msg.respond(b'{"v":1,"type":"PodsGetReply","uid":"u","state":"live","evidence":"b"}')

    await nc.subscribe(pods_get_subject(node), queue="q", cb=answer)
    await nc.flush()


async def publish(js: JetStreamContext, subject: str, body: bytes, samples: Samples) -> None:
    try:
        await js.publish(subject, body, headers={SENT: repr(time.time())}, timeout=10)
        samples.published += 1
    except (TimeoutError, nats.errors.Error):
        samples.errors += 1


async def cas(kv: KeyValue, key: str, samples: Samples) -> None:
    started = time.monotonic()
    for _ in range(10):
        try:
            entry = await kv.get(key)
            await kv.update(key, (entry.value or b"")[:64] + b".", last=entry.revision)
        except nats.js.errors.KeyNotFoundError:
            try:
                await kv.create(key, b"{}")
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
        except nats.js.errors.KeyWrongLastSequenceError:
            continue
        except (TimeoutError, nats.errors.Error):
            samples.errors += 1
            return
        samples.cas.append(time.monotonic() - started)
        return


async def node_cycles(nc: Client, node: str, cycle: float, end: float, samples: Samples,
                      rng: random.Random) -> None:
    js = nc.jetstream()
    claims = await js.key_value(BUCKET_CLAIMS)
    capacity = await js.key_value(BUCKET_CAPACITY)
    await asyncio.sleep(rng.uniform(0, cycle))
    serial = 0
    while time.monotonic() < end:
        serial += 1
        uid = f"{node}-{serial}"
        card = rng.randrange(CARDS)
        for kind in ("PodSeen", "PodFinished", "PodGone"):
            await publish(js, pods_subject(node, f"0b6f4a1e-0000-4000-8000-{serial:012d}"),
                          json.dumps({"v": 1, "type": kind, "uid": uid}).encode(), samples)
        for state in ("creating", "active", "releasing", "removed"):
            await cas(claims, claims_key(node, card), samples)
            await publish(js, parts_subject(node, card),
                          json.dumps({"v": 1, "type": "ClaimChanged", "state": state}).encode(),
                          samples)
        try:
            await capacity.put(node, b'{"v":1}')
        except (TimeoutError, nats.errors.Error):
            samples.errors += 1
        started = time.monotonic()
        try:
            await nc.request(pods_get_subject(node), b'{"uid":"u"}', timeout=5)
            samples.request.append(time.monotonic() - started)
        except (TimeoutError, nats.errors.Error):
            samples.errors += 1
        await asyncio.sleep(cycle)


def varz(cluster: Cluster, index: int, path: str) -> dict[str, Any]:
    """A monitoring endpoint's JSON document."""
    url = f"http://127.0.0.1:{cluster.monitors[index]}/{path}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        found: dict[str, Any] = json.loads(resp.read())
    return found


async def start_one_node(url: list[str], node: str, layout: str) -> float:
    """Seconds until one more node's bus side is up, as its services would bring it up."""
    started = time.monotonic()
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await ensure_topology(js, replicas=3)
        await create_consumers(js, [node], layout)
        claims = await Bucket.open(js, BUCKET_CLAIMS)
        await entries(claims, f"{node}.*")
        pods = await Bucket.open(js, BUCKET_PODS)
        await entries(pods, f"{node}.*")
        await responder(nc, node)
        await nc.request(pods_get_subject(node), b'{"uid":"u"}', timeout=10)
        return time.monotonic() - started
    finally:
        await nc.close()


async def run(nodes: int, layout: str, seconds: float, cycle: float, clients: int) -> dict:
    root = cluster_root()
    cluster = Cluster(root)
    try:
        await cluster.start()
        url = cluster.url.split(",")
        ncs = [await nats.connect(url, max_reconnect_attempts=-1) for _ in range(clients)]
        names = [f"fleet-{i:04d}" for i in range(nodes)]
        setup = time.monotonic()
        await create_consumers(ncs[0].jetstream(), names, layout)
        consumers_seconds = time.monotonic() - setup
        samples = Samples()
        rng = random.Random(7)
        tasks = []
        for i, node in enumerate(names):
            nc = ncs[i % clients]
            await responder(nc, node)
            for stream, config in consumer_configs(node, layout):
                assert config.durable_name is not None  # every consumer here is durable
                tasks.append(asyncio.create_task(
                    consume(nc.jetstream(), stream, config.durable_name, samples)))
        end = time.monotonic() + seconds
        cpu_before = time.process_time()
        tasks.append(asyncio.create_task(tick(samples)))
        tasks += [asyncio.create_task(node_cycles(ncs[i % clients], node, cycle, end, samples,
                                                   random.Random(rng.random())))
                  for i, node in enumerate(names)]
        await asyncio.sleep(seconds + 5)  # the load runs this long; then the drain below
        generator_cpu = (time.process_time() - cpu_before) / (seconds + 5)
        server_cpu = [float(varz(cluster, i, "varz")["cpu"]) for i in range(3)]
        startup = await start_one_node(url, f"fleet-new-{nodes}", layout)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        mem = [int(varz(cluster, i, "varz")["mem"]) for i in range(3)]
        account = await ncs[0].jetstream().account_info()
        counts = (int(account.streams), int(account.consumers))
        for nc in ncs:
            await nc.close()
        out = figures(nodes, layout, seconds, cycle, samples, mem, counts, consumers_seconds,
                      startup)
        out["generator_cpu_cores"] = round(generator_cpu, 2)
        out["server_cpu_percent"] = server_cpu
        return out
    finally:
        await cluster.stop()
        remove(root)


def figures(nodes: int, layout: str, seconds: float, cycle: float, samples: Samples,
            mem: list[int], counts: tuple[int, int], consumers_seconds: float,
            startup: float) -> dict:
    streams, consumers = counts
    replicated_consumers = consumers if layout == "r3" else 0  # an R1 consumer has no raft group
    out = {
        "nodes": nodes, "layout": layout, "seconds": seconds, "cycle_seconds": cycle,
        "server_rss_mib": [round(m / 2**20) for m in mem],
        "streams": streams, "consumers": consumers,
        "raft_groups": 1 + streams + replicated_consumers,
        "consumers_created_seconds": round(consumers_seconds, 1),
        "published": samples.published, "delivered": samples.delivered,
        "errors": samples.errors, "start_one_node_seconds": round(startup, 2),
    }
    for label, values in (("publish_deliver", samples.deliver), ("consumer_lag", samples.lag),
                          ("kv_cas", samples.cas), ("pods_get", samples.request),
                          ("generator_loop_late", samples.loop)):
        lat = Latency.of(label, values)
        out[f"{label}_ms"] = None if lat is None else {"p50": round(lat.p50, 1),
                                                       "p99": round(lat.p99, 1), "n": lat.n}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__)
    parser.add_argument("--nodes", default="50",
                        help="fleet sizes, comma separated (one cluster and one line each)")
    parser.add_argument("--layout", choices=("r1", "r3"), default="r1")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cycle", type=float, default=10.0, help="seconds between a node's Pods")
    parser.add_argument("--clients", type=int, default=8, help="NATS connections shared by nodes")
    args = parser.parse_args()
    for nodes in (int(n) for n in args.nodes.split(",")):
        try:
            result = asyncio.run(run(nodes, args.layout, args.seconds, args.cycle, args.clients))
        except Exception as exc:  # where it stops is a figure too
            result = {"nodes": nodes, "layout": args.layout, "stopped": str(exc)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
