"""One Allocate followed through the code: `python -m bench.allocate_path [--show]`.

A reader's measure, not a timing. The allocator runs as `bench.allocate_latency` runs it (a real
nats-server, the sim driver, kubelet's side as a gRPC client); one warm-up Allocate, a reclaim,
then one Allocate for a fresh pending Pod is followed with `sys.setprofile` from the servicer's
`Allocate` to its reply, in the event loop's thread (work handed to a thread, the driver's calls
and the container edits, is counted at the call that hands it over).

What it prints, read as a newcomer reads the code: each function is read once, where it is first
called, depth first. The reading's path is the sequence of modules those functions live in.

- modules met: the distinct modules of `services/allocator/` on the path (and, for scale, the
  project's modules in all: `partkeeper`, `schemas`, the other services);
- returns to a module already left: a function read in a module the reader had closed (no
  function of it open on the reading's stack) after reading another module. Returning to a
  caller whose function is still open is not one: that is reading on where one left off.

The goal (the allocator's shape): at most 8 allocator modules, at most 2 returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import logging
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import nats

from bench.allocate_latency import RESOURCE, TOKEN, Serialised, _pod, _reclaim
from partkeeper.bus import ensure_topology
from partkeeper.bus.kv import Bucket
from partkeeper.bus.permissions import ADMIN, inbox_prefix
from partkeeper.claims import ClaimsStore
from partkeeper.kubelet import deviceplugin_pb2 as pb
from partkeeper.kubelet import deviceplugin_pb2_grpc, open_unix_channel
from partkeeper_sim.driver import SimDriver, init_state
from partkeeper_sim.stack.natsserver import NatsServer
from schemas import PodRecord, encode
from schemas.names import BUCKET_CLAIMS, BUCKET_PODS, encode_token, pods_key
from services.allocator.core.options import Options
from services.allocator.deviceplugin.registration import endpoint_name
from services.allocator.main import serve as serve_allocator
from tests_support.lone_allocator import lone_config, pending_watcher

NODE = "path-node"
GOAL_MODULES, GOAL_RETURNS = 8, 2
ALLOCATOR = "services.allocator."
PROJECT = ("services.", "partkeeper.", "schemas.")
SERVICER = ("services.allocator.deviceplugin.plugin", "Allocate")

_following: contextvars.ContextVar[bool] = contextvars.ContextVar("following", default=False)


COMPREHENSIONS = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}


@dataclass
class Reading:
    """Each project function in first-call order with the function that first called it: the
    call tree a reader walks, depth first."""

    parent: dict[tuple[str, str], tuple[str, str] | None] = field(default_factory=dict)

    def call(self, frame: FrameType) -> None:
        key = _key(frame)
        if key is None or key in self.parent:
            return
        module, name = key
        if "<locals>" in name:  # a callback is read where it is written, in the function around it
            self.parent[key] = (module, name.rsplit(".<locals>.", 1)[0])
            return
        caller = _caller(frame)
        if caller is not None and caller not in self.parent:  # named as cr_origin names it
            caller = next((k for k in self.parent if k[0] == caller[0]
                           and k[1].rsplit(".", 1)[-1] == caller[1]), caller)
        self.parent[key] = caller

    @property
    def read(self) -> list[tuple[str, str, int]]:
        """(module, function, depth) in the order a reader reads them."""
        children: dict[tuple[str, str] | None, list[tuple[str, str]]] = {}
        for key, parent in self.parent.items():
            children.setdefault(parent if parent in self.parent else None, []).append(key)
        out: list[tuple[str, str, int]] = []

        def walk(key: tuple[str, str] | None, depth: int) -> None:
            for child in children.get(key, []):
                out.append((*child, depth))
                walk(child, depth + 1)

        walk(None, 0)
        return out


def _key(frame: FrameType) -> tuple[str, str] | None:
    """The function a frame runs, as a reader names it; None for what a reader does not read as
    a function of its own (comprehensions, generated `__init__`s, code outside the project)."""
    code = frame.f_code
    module = frame.f_globals.get("__name__", "")
    if (not module.startswith(PROJECT) or code.co_name in COMPREHENSIONS
            or code.co_filename.startswith("<")):
        return None
    return module, code.co_qualname


def _caller(frame: FrameType) -> tuple[str, str] | None:
    """The nearest project function up the stack; for a task's own coroutine, where the task's
    coroutine was made (its `cr_origin`)."""
    up = frame.f_back
    while up is not None:
        if (key := _key(up)) is not None:
            return key
        up = up.f_back
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return None
    origin = getattr(task.get_coro(), "cr_origin", None) if task is not None else None
    for filename, _line, function in origin or ():
        module = _MODULE_OF.get(filename)
        if module is not None and module.startswith(PROJECT) and function not in COMPREHENSIONS:
            return module, function
    return None


_MODULE_OF: dict[str, str] = {}


def path_of(read: list[tuple[str, str, int]], within: str) -> tuple[list[str], list[str]]:
    """The modules (under `within`) in reading order, and the returns to one already left.

    The reading's stack is rebuilt from the depths: a function read at depth d closes every open
    function at depth >= d. A module is open while one of its functions is on that stack."""
    stack: list[str] = []
    met: list[str] = []
    returns: list[str] = []
    closed: set[str] = set()
    for module, function, depth in read:
        while len(stack) > depth:
            gone = stack.pop()
            if gone not in stack:
                closed.add(gone)
        opened = module in stack
        stack.append(module)
        if not module.startswith(within):
            continue
        if module not in met:
            met.append(module)
        elif module in closed and not opened:
            returns.append(f"{module}.{function}")
        closed.discard(module)
    return met, returns


def _profiler(reading: Reading) -> Any:
    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        if (frame.f_globals.get("__name__"), frame.f_code.co_name) == SERVICER:
            _following.set(True)
        if _following.get():
            reading.call(frame)

    return profile


async def follow(where: str) -> Reading:
    server = NatsServer().start()
    directory = Path(tempfile.mkdtemp(prefix="pk", dir=where))
    nc = await nats.connect(server.url, inbox_prefix=inbox_prefix(ADMIN, encode_token(NODE)))
    tasks: list[asyncio.Task[None]] = []
    reading = Reading()
    try:
        js = nc.jetstream()
        await ensure_topology(js)
        init_state(directory / "sim.json", ["H100-80GB"], [])
        driver = Serialised(SimDriver(directory / "sim.json"))
        pending: list[PodRecord] = []
        watcher = await pending_watcher(nc, NODE, pending)
        config = lone_config(directory, NODE)
        ready = asyncio.Event()
        tasks.append(asyncio.create_task(serve_allocator(
            config, nc, ready=ready, options=Options(driver=driver))))
        await asyncio.wait_for(ready.wait(), 30)
        pods = await js.key_value(BUCKET_PODS)
        store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), NODE)
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=[TOKEN])])
        async with open_unix_channel(config.kubelet_dir / endpoint_name(RESOURCE)) as channel:
            stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
            for i, followed in enumerate((False, True)):
                record = _pod(i)
                await pods.put(pods_key(NODE, record.uid), encode(record))
                pending[:] = [record]
                if followed:
                    _MODULE_OF.update({getattr(m, "__file__", None) or "": n
                                       for n, m in list(sys.modules.items())})
                    sys.set_coroutine_origin_tracking_depth(64)
                    sys.setprofile(_profiler(reading))
                try:
                    await stub.Allocate(request, timeout=30)
                finally:
                    sys.setprofile(None)
                    sys.set_coroutine_origin_tracking_depth(0)
                pending.clear()
                if not followed:
                    await _reclaim(store, driver)
        await watcher.stop()
        return reading
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await nc.drain()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(server.store_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocate_path", description=__doc__)
    parser.add_argument("--show", action="store_true", help="print the reading, function by "
                        "function, indented by depth")
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    reading = asyncio.run(follow(args.dir))
    if args.show:
        for module, function, depth in reading.read:
            print(f"{'  ' * depth}{module}.{function}")
    mine, returns = path_of(reading.read, ALLOCATOR)
    everything, all_returns = path_of(reading.read, "")
    print(f"one Allocate (device plugin, a fresh Pod, {RESOURCE}) read from the servicer to "
          f"its reply, {len(reading.read)} functions:")
    print(f"  allocator modules met: {len(mine)} (goal <= {GOAL_MODULES}): "
          + ", ".join(m.removeprefix(ALLOCATOR) for m in mine))
    print(f"  returns to an allocator module already left: {len(returns)} "
          f"(goal <= {GOAL_RETURNS})" + (": " + ", ".join(
              r.removeprefix(ALLOCATOR) for r in returns) if returns else ""))
    print(f"  project modules met in all: {len(everything)}, returns among them: "
          f"{len(all_returns)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
