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
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from bench.allocate_latency import NODE, RESOURCE, TOKEN, _pod, _reclaim, lone_node
from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.kubelet import deviceplugin_pb2 as pb
from partkeeper.kubelet import deviceplugin_pb2_grpc, open_unix_channel
from schemas import encode
from schemas.names import BUCKET_CLAIMS, BUCKET_PODS, pods_key
from services.allocator.deviceplugin.registration import endpoint_name

GOAL_MODULES, GOAL_RETURNS = 8, 2
ALLOCATOR = "services.allocator."
PROJECT = ("services.", "partkeeper.", "schemas.")
SERVICER = ("services.allocator.deviceplugin.plugin", "Allocate")
SEEDS = ("services.allocator.deviceplugin.allocate", "allocate")  # where offer and IDs arrive

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
        return self.only(set(self.parent))

    def only(self, kept: set[tuple[str, str]]) -> list[tuple[str, str, int]]:
        """The reading of the `kept` functions alone: one that is not kept is skipped, and what
        it called is read at its place."""
        children: dict[tuple[str, str] | None, list[tuple[str, str]]] = {}
        for key, parent in self.parent.items():
            children.setdefault(parent if parent in self.parent else None, []).append(key)
        out: list[tuple[str, str, int]] = []

        def walk(key: tuple[str, str] | None, depth: int) -> None:
            for child in children.get(key, []):
                if child in kept:
                    out.append((*child, depth))
                    walk(child, depth + 1)
                else:
                    walk(child, depth)

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
    function at depth >= d. A module is open while one of its functions is on that stack. A
    return is a function read in a closed module after the reader went elsewhere: into a module
    that was not open. Reading on in the caller, then calling into the same module again, is
    not one."""
    stack: list[str] = []
    met: list[str] = []
    returns: list[str] = []
    away: dict[str, bool] = {}  # closed module -> the reader has gone elsewhere since
    for module, function, depth in read:
        while len(stack) > depth:
            gone = stack.pop()
            if gone not in stack and gone.startswith(within):
                away[gone] = False
        if not module.startswith(within):
            stack.append(module)
            continue
        if module not in stack:
            if away.pop(module, False):
                returns.append(f"{module}.{function}")
            for other in away:
                away[other] = True
        if module not in met:
            met.append(module)
        stack.append(module)
    return met, returns


class Data:
    """The request's data as it moves: kubelet's device IDs and the offer they are for, then
    whatever a function handed them returns (the Pod found, the claims, the plan, the reply).
    Numbers, booleans and None are never followed: they are shared by value, not by the request.
    """

    def __init__(self) -> None:
        self._held: list[object] = []  # kept alive, so that an id is never reused meanwhile
        self._ids: set[int] = set()
        self.met: set[tuple[str, str]] = set()  # functions that were handed the data

    def follow(self, value: object, depth: int = 2) -> None:
        if value is None or isinstance(value, (bool, int, float, asyncio.Future)):
            return
        if id(value) not in self._ids:
            self._ids.add(id(value))
            self._held.append(value)
        if depth == 0 or isinstance(value, (str, bytes)):
            return
        if isinstance(value, dict):
            for item in (*value.keys(), *value.values()):
                self.follow(item, depth - 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                self.follow(item, depth - 1)
        else:
            for name in _fields(value):
                self.follow(getattr(value, name, None), depth - 1)

    def handed(self, frame: FrameType) -> bool:
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
        names = code.co_varnames[:count]
        values = [frame.f_locals.get(n) for n in names if n not in ("self", "cls")]
        flat: list[object] = []
        for value in values:  # the value, and what it holds one level down
            flat.append(value)
            if isinstance(value, (tuple, list)):
                flat.extend(value)
            elif isinstance(value, dict):
                flat.extend(value.values())
            elif not isinstance(value, (str, bytes)):
                flat.extend(getattr(value, n, None) for n in _fields(value))
        return any(id(v) in self._ids for v in flat
                   if v is not None and not isinstance(v, (bool, int, float)))


def _fields(value: object) -> tuple[str, ...]:
    """The attributes a value holds: a dataclass's or msgspec Struct's fields, or its dict."""
    kind = type(value)
    if kind.__module__ == "builtins" or not kind.__module__.startswith(PROJECT):
        return ()
    return (*getattr(kind, "__slots__", ()), *getattr(kind, "__struct_fields__", ()),
            *getattr(value, "__dict__", {}))


_tasks: dict[int, bool] = {}


def _followed(task: asyncio.Task[Any] | None) -> bool:
    """Whether a task is part of the Allocate: started by the allocator's code, whose tasks the
    call waits for (the call itself, the realisation, the pod-resources view). A task the kit
    starts and nobody waits for, the claims store's announcement of a write once the Allocates
    in flight are done, is not on the way to the reply."""
    if task is None:
        return True
    if id(task) not in _tasks:
        origin = getattr(task.get_coro(), "cr_origin", None) or ()
        modules = [_MODULE_OF.get(filename, "") for filename, _line, _function in origin]
        first = next((m for m in modules if m.startswith(PROJECT)), "services.")
        _tasks[id(task)] = first.startswith("services.")
    return _tasks[id(task)]


def _profiler(reading: Reading, data: Data) -> Any:
    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event not in ("call", "return"):
            return
        name = (frame.f_globals.get("__name__"), frame.f_code.co_name)
        if event == "call" and name == SEEDS:
            data.follow(frame.f_locals.get("offer"))
            data.follow(frame.f_locals.get("device_ids"))
        if event == "call" and name == SERVICER:
            _following.set(True)
        if not _following.get() or _key(frame) is None or not _followed(asyncio.current_task()):
            return
        if event == "call":
            reading.call(frame)
            if name in (SERVICER, SEEDS) or data.handed(frame):
                data.met.add(_key(frame))  # type: ignore[arg-type]
        elif _key(frame) in data.met:
            data.follow(arg)

    return profile


async def follow(where: str) -> tuple[Reading, Data]:
    reading = Reading()
    data = Data()
    async with lone_node(where) as lone:
        js = lone.nc.jetstream()
        pods = await js.key_value(BUCKET_PODS)
        store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), NODE)
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=[TOKEN])])
        socket = lone.config.kubelet_dir / endpoint_name(RESOURCE)
        async with open_unix_channel(socket) as channel:
            stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)
            for i, followed in enumerate((False, True)):
                record = _pod(i)
                await pods.put(pods_key(NODE, record.uid), encode(record))
                lone.pending[:] = [record]
                if followed:
                    _MODULE_OF.update({getattr(m, "__file__", None) or "": n
                                       for n, m in list(sys.modules.items())})
                    sys.set_coroutine_origin_tracking_depth(64)
                    sys.setprofile(_profiler(reading, data))
                try:
                    await stub.Allocate(request, timeout=30)
                finally:
                    sys.setprofile(None)
                    sys.set_coroutine_origin_tracking_depth(0)
                lone.pending.clear()
                if not followed:
                    await _reclaim(store, lone.driver)
    return reading, data


def report(title: str, read: list[tuple[str, str, int]], *, goal: bool) -> list[str]:
    mine, returns = path_of(read, ALLOCATOR)
    everything, all_returns = path_of(read, "")
    aim = (f" (goal <= {GOAL_MODULES})", f" (goal <= {GOAL_RETURNS})") if goal else ("", "")
    return [
        f"{title}: {len(read)} functions",
        f"  allocator modules met: {len(mine)}{aim[0]}: "
        + ", ".join(m.removeprefix(ALLOCATOR) for m in mine),
        f"  returns to an allocator module already left: {len(returns)}{aim[1]}"
        + (": " + ", ".join(r.removeprefix(ALLOCATOR) for r in returns) if returns else ""),
        f"  project modules met in all: {len(everything)}, returns among them: "
        f"{len(all_returns)}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocate_path", description=__doc__)
    parser.add_argument("--show", choices=("data", "control"), help="print that reading, "
                        "function by function, indented by depth")
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    reading, data = asyncio.run(follow(args.dir))
    as_data = reading.only(data.met)
    if args.show:
        for module, function, depth in as_data if args.show == "data" else reading.read:
            print(f"{'  ' * depth}{module}.{function}")
    print(f"one Allocate (device plugin, a fresh Pod, {RESOURCE}), from the servicer to its "
          "reply")
    print("\n".join(report("followed as data (the functions handed the request's data)",
                           as_data, goal=True)))
    print("\n".join(report("followed as control (every function called)", reading.read,
                           goal=False)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
