"""The floor under a hot path, measured in the same run: its bare round trips, nothing else.

Three round trips make up every path partkeeper times (issue 27), each measured here on the
nats-server and in the socket directory the benchmark itself uses, so the figures and their
floors share the machine's moment:

- a bare gRPC unary call over a unix socket (the device plugin's `GetDevicePluginOptions`
  answered by a servicer that does nothing else), as kubelet calls Allocate;
- a bare NATS request/reply (a core subscription answering at once), as a service asks another
  and as a KV read or a JetStream API call travels;
- a JetStream KV compare-and-set update on a file-stored bucket configured as partkeeper's
  (history 1), each against the revision the previous one returned: a claim write, and the
  closest bare relative of a JetStream publish (both are stored before the server answers).

A path's floor is the sum of the round trips it is made of (`Path`), per percentile. Each figure
is printed beside it as a ratio, so a slower machine does not hide a regression and a faster one
does not flatter (absolute times move with the load; ratios less).
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

import grpc
import nats
import nats.errors
from nats.aio.msg import Msg
from nats.js import api

from partkeeper import backoff
from partkeeper.kubelet import deviceplugin_pb2 as pb
from partkeeper.kubelet import deviceplugin_pb2_grpc, open_unix_channel, serve_unix

DEFAULT_CALLS = 200
WARMUP = 20
FLOOR_BUCKET = "pk-bench-floor"

# The goals, exactly as issue 27 states them; a benchmark prints these and sets none of its own.
GOALS = {
    "allocate": "Allocate p99 < 10 ms",
    "destroyed": "T1-T0 p99 < 30 ms",
    "advertised": "T2-T0 p99 < 50 ms",
    "admitted": "replacement Pod created -> Running p99 < 30 ms",
    "prepare": "DRA prepare p99 < 20 ms",
    "republished": "DRA Pod deleted -> slices re-published p99 < 100 ms",
}
GOAL_P99_MS = {"allocate": 10.0, "destroyed": 30.0, "advertised": 50.0, "admitted": 30.0,
               "prepare": 20.0, "republished": 100.0}


@dataclass(frozen=True, slots=True)
class Quantiles:
    p50: float  # ms
    p99: float

    @classmethod
    def of(cls, seconds: list[float]) -> Quantiles:
        ms = sorted(s * 1000 for s in seconds)
        return cls(statistics.median(ms), ms[min(len(ms) - 1, round(0.99 * len(ms)))])


@dataclass(frozen=True, slots=True)
class Floors:
    grpc: Quantiles
    request: Quantiles
    cas: Quantiles
    calls: int

    def lines(self) -> list[str]:
        return [
            f"floor, measured in this run ({self.calls} calls each, same nats-server and "
            "socket directory):",
            f"  bare gRPC unary over a unix socket: p50 {self.grpc.p50:.2f} ms, "
            f"p99 {self.grpc.p99:.2f} ms",
            f"  bare NATS request/reply: p50 {self.request.p50:.2f} ms, "
            f"p99 {self.request.p99:.2f} ms",
            f"  JetStream KV compare-and-set update: p50 {self.cas.p50:.2f} ms, "
            f"p99 {self.cas.p99:.2f} ms",
        ]


@dataclass(frozen=True, slots=True)
class Path:
    """The round trips a path is made of, on its critical path (see docs/benchmarks.md)."""

    grpc: int = 0
    requests: int = 0  # service requests, KV reads, JetStream API calls
    writes: int = 0  # KV compare-and-set updates and JetStream publishes

    def floor(self, floors: Floors) -> Quantiles:
        def total(q: str) -> float:
            return (self.grpc * getattr(floors.grpc, q) + self.requests * getattr(
                floors.request, q) + self.writes * getattr(floors.cas, q))

        return Quantiles(total("p50"), total("p99"))

    def text(self) -> str:
        parts = [(self.grpc, "gRPC call"), (self.requests, "NATS request"),
                 (self.writes, "KV CAS")]
        return " + ".join(f"{n} {what}{'s' if n > 1 else ''}" for n, what in parts if n)


# What each path is made of, on its critical path, in bare round trips (issue 27; the counts the
# services make are asserted in tests/allocator/test_round_trips.py). HTTP to the API server
# (the delete, the watches, the slice writes) is not in a floor: these are lower bounds.
PATHS = {
    # kubelet's call, the Pod lookup, two claim writes (the claims come from the allocator's
    # views, and the two events follow the reply: neither is waited for)
    "allocate": Path(grpc=1, requests=1, writes=2),
    # PodGone stored, delivered to the reclaimer, the card read, `releasing` written
    "destroyed": Path(requests=2, writes=2),
    # ... then `removed` written and announced, the allocator woken, ListAndWatch sent
    "advertised": Path(grpc=1, requests=3, writes=4),
    # the Allocate of the replacement (scheduling, binding and the kubelet's sync are HTTP)
    "admitted": Path(grpc=1, requests=1, writes=2),
    # NodePrepareResources, `creating` and `active` written (the claims from the views, the
    # events after the answer)
    "prepare": Path(grpc=1, writes=2),
    # PodGone stored and delivered, the card read, released, removed and announced, the
    # allocator woken (the slice writes themselves are HTTP)
    "republished": Path(requests=3, writes=4),
}


def beside(p50: float, p99: float, path: Path, floors: Floors) -> str:
    """`p50 ... p99 ...` of a figure as ratios of its path's floor."""
    floor = path.floor(floors)
    return (f"floor ({path.text()}) p50 {floor.p50:.2f} ms, p99 {floor.p99:.2f} ms; figure/floor "
            f"p50 {ratio(p50, floor.p50)}, p99 {ratio(p99, floor.p99)}")


def ratio(value: float, floor: float) -> str:
    if floor <= 0 or value != value or value == float("inf"):
        return "n/a"
    return f"{value / floor:.1f}x"


def row(key: str, p50: float, p99: float, floors: Floors) -> str:
    """The floor, the ratios and the goal of one figure of path `key`, on one line."""
    return f"{beside(p50, p99, PATHS[key], floors)}; {goal(key, p99)}"


def goal(key: str, p99: float) -> str:
    met = p99 < GOAL_P99_MS[key]
    return f"goal (issue 27): {GOALS[key]}: {'met' if met else 'NOT met'}"


class _Bare(deviceplugin_pb2_grpc.DevicePluginServicer):
    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()


async def _timed(call: Callable[[], Awaitable[object]], calls: int) -> list[float]:
    for _ in range(WARMUP):
        await call()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


async def grpc_floor(socket_dir: FsPath, calls: int) -> Quantiles:
    socket = socket_dir / f"floor-{secrets.token_hex(4)}.sock"
    server = grpc.aio.server()
    deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(_Bare(), server)
    await serve_unix(server, socket)
    try:
        async with open_unix_channel(socket) as channel:
            stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
            return Quantiles.of(await _timed(
                lambda: stub.GetDevicePluginOptions(pb.Empty(), timeout=10), calls))
    finally:
        await server.stop(None)
        socket.unlink(missing_ok=True)


async def nats_floors(nats_url: str, calls: int, auth: Mapping[str, Any]
                      ) -> tuple[Quantiles, Quantiles]:
    """The bare request/reply and the KV compare-and-set update, on their own connections (a
    responder and a requester, as two services are), logged in with `auth` (nats.connect
    keywords: the embedded stack's admin, whose account holds the services' subjects)."""
    responder = await nats.connect(nats_url, **auth)
    requester = await nats.connect(nats_url, **auth)
    try:
        subject = f"pk.bench.floor.{secrets.token_hex(4)}"

        async def answer(msg: Msg) -> None:
            await msg.respond(b"ok")

        sub = await responder.subscribe(subject, cb=answer)
        await responder.flush()
        # The first request may find no responder yet when the server is busy (the stack is
        # still settling); the floor waits for the subscription, boundedly, before timing.
        await backoff.retry("the floor's responder", lambda: requester.request(
            subject, b"ping", timeout=10), transient=lambda exc: isinstance(
                exc, nats.errors.NoRespondersError), attempts=20)
        request = Quantiles.of(await _timed(
            lambda: requester.request(subject, b"ping", timeout=10), calls))
        await sub.unsubscribe()
        js = requester.jetstream()
        kv = await js.create_key_value(bucket=FLOOR_BUCKET, history=1,
                                       storage=api.StorageType.FILE)
        revision = [await kv.put("card.0", b"{}")]

        async def cas() -> None:
            revision[0] = await kv.update("card.0", b"{}", last=revision[0])

        try:
            return request, Quantiles.of(await _timed(cas, calls))
        finally:
            await js.delete_key_value(FLOOR_BUCKET)
    finally:
        await requester.close()
        await responder.close()


async def measure(nats_url: str, socket_dir: FsPath, calls: int = DEFAULT_CALLS,
                  auth: Mapping[str, Any] | None = None) -> Floors:
    """The three floors, one after the other, on `nats_url` and in `socket_dir`."""
    grpc_q = await grpc_floor(socket_dir, calls)
    request, cas = await nats_floors(nats_url, calls, auth or {})
    return Floors(grpc_q, request, cas, calls)


def main() -> int:
    """`python -m bench.floors`: the floors alone, on a nats-server of their own."""
    import tempfile

    from partkeeper_sim.stack.natsserver import NatsServer

    server = NatsServer().start()
    directory = FsPath(tempfile.mkdtemp(prefix="pk-floor-"))
    try:
        floors = asyncio.run(measure(server.url, directory))
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(server.store_dir, ignore_errors=True)
    print("\n".join(floors.lines()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
