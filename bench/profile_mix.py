"""The stall of mutually exclusive profiles: `python -m bench.profile_mix [--waits 2,10,30]`.

An empty H100-80GB advertises 7 x 1g.10gb and 1 x 7g.80gb, all Healthy, though a 7g and a 1g
cannot both fit: kubelet admits both when they are submitted together. The one whose Allocate
comes second waits for room (`Options.room_wait_seconds`) and is then refused with a sentence
saying the profile mix cannot fit; meanwhile kubelet admits nothing else on the node (its
admissions run one at a time). Whether the second Pod is over-admitted at all depends on a race:
if the allocator's withdrawn tokens reach kubelet before it admits the second Pod, kubelet
refuses it at once (OutOf<resource>). For each room wait this prints how often each happened and
the stall of the over-admitted Pods (binding to refusal), on the whole in-process node of
bench.chaos (real watcher, allocator, reclaimer, simulated kubelet and API server).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

import nats

from bench.chaos_node import ALLOCATOR, chaos_node
from partkeeper.bus import ensure_topology
from partkeeper_sim.kubelet import PodState
from partkeeper_sim.stack.natsserver import NatsServer

PREFIX = "nvidia.com/mig-"
DEADLINE = 120.0


async def _when(check: Callable[[], object], what: str) -> float:
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {DEADLINE:.0f}s: {what}")
        await asyncio.sleep(0.005)
    return time.monotonic()


async def sample(nc: nats.NATS, wait: float) -> tuple[float, str, str]:
    """(binding to refusal in seconds, the refusal's reason, its message)"""
    options = replace(ALLOCATOR, room_wait_seconds=wait)
    async with chaos_node(nc, f"mix-{uuid.uuid4().hex[:6]}", allocator=options) as node:
        big = await node.create("big", PREFIX + "7g.80gb")
        small = await node.create("small", PREFIX + "1g.10gb")
        started = time.monotonic()
        await asyncio.gather(node.bind("big"), node.bind("small"))

        def state(uid: str) -> PodState | None:
            record = node.kubelet.record(uid)
            return record.state if record is not None else None

        refused = await _when(lambda: PodState.REJECTED in (state(big), state(small)),
                              "one of the two is refused")
        loser = node.kubelet.record(big if state(big) is PodState.REJECTED else small)
        assert loser is not None
        return refused - started, loser.reason, loser.message


async def _main(waits: list[float], samples: int) -> int:
    server = NatsServer().start()
    try:
        nc = await nats.connect(server.url)
        await ensure_topology(nc.jetstream())
        stalled_message = ""
        for wait in waits:
            results = [await sample(nc, wait) for _ in range(samples)]
            over = [r for r in results if not r[1].startswith("OutOf")]
            quick = len(results) - len(over)
            line = (f"room wait {wait:g}s, {samples} samples: {quick} refused at admission "
                    f"(the withdrawn token reached kubelet first)")
            if over:
                stalled_message = over[-1][2]
                stalls = ", ".join(f"{r[0]:.2f}s" for r in over)
                line += f"; {len(over)} over-admitted, refused after {stalls}"
            print(line)
        if stalled_message:
            print(f"refusal: {stalled_message}")
        await nc.drain()
    finally:
        server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_mix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waits", default="2,10,30", help="room waits to try, in seconds")
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    return asyncio.run(_main([float(w) for w in args.waits.split(",")], args.samples))


if __name__ == "__main__":
    sys.exit(main())
