"""The seeded randomized attacker at volume: one node's service credentials against the four real
services of that node and another node's records, on a real nats-server with the shipped
permissions (tests_support/attacker.py says the model and the checks).

    python -m bench.attacker [--messages 10000] [--seed 1]

Goal (one node's credentials reach no further than that node): at least 10,000 messages per
service user, nothing found: no other node's key or stream message changed, this node's live
keys still read as their documents, no service restarted, and a Pod lifecycle passes afterwards.
The floor printed beside it is the same attacker's messages against the same server with no
service running: what publishing them costs, before any service reads one.

CI runs a short seed of the same test (tests/reliability/test_attacker.py).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time

import nats

from partkeeper.bus import ensure_topology
from partkeeper_sim.stack.launch import SERVICES
from partkeeper_sim.stack.natsserver import EmbeddedUsers, NatsServer
from tests_support.access import CONFIG
from tests_support.attacker import Before, attack_all, seed_other_node
from tests_support.reliability import scene

GOAL = 10_000
RESTARTED = b"starting it again"


async def _floor(messages: int, seed: int) -> float:
    """The same messages to a bare, provisioned server with the shipped permissions."""
    server = NatsServer(config=str(CONFIG)).start()
    try:
        admin = await nats.connect(server.url, user="pk-admin", password="pk-admin-dev")
        await ensure_topology(admin.jetstream())
        await admin.close()
        start = time.perf_counter()
        await attack_all(server.url, messages, seed)
        return time.perf_counter() - start
    finally:
        server.stop()
        shutil.rmtree(server.store_dir, ignore_errors=True)


async def run(messages: int, seed: int) -> list[str]:
    server = NatsServer(config=str(CONFIG)).start()
    lines: list[str] = []
    try:
        async with scene(servers=[server], users=EmbeddedUsers.shipped()) as sc:
            js = sc.rig.stack.nc.jetstream()
            await seed_other_node(js)
            held = await sc.admit("1g.10gb", "held")
            before = await Before.take(js)
            start = time.perf_counter()
            tally = await attack_all(server.url, messages, seed)
            took = time.perf_counter() - start
            problems = await before.check(js)
            dead = [n for n in SERVICES if not sc.rig.alive(n)]
            restarted = [n for n in SERVICES
                         if RESTARTED in sc.rig.layout.log(n).read_bytes()]
            after = await sc.admit("2g.20gb", "after")
            for pod in (held, after):
                await sc.work.delete(pod)
            await sc.check_converged()
            sent = dict(tally.sent)
            lines.append(f"goal: >= {GOAL} messages per service user, nothing found")
            per_user = ", ".join(f"{k} {v}" for k, v in sent.items())
            lines.append(
                f"measured: {sum(sent.values())} messages ({per_user}) "
                f"in {took:.1f}s, {sum(sent.values()) / took:.0f}/s, seed {seed}; "
                f"found: {len(problems)} changed keys or messages, {len(dead)} services ended, "
                f"{len(restarted)} restarted; Pod lifecycle afterwards: passed")
            for problem in problems[:10]:
                lines.append(f"  changed: {problem}")
    finally:
        server.stop()
        shutil.rmtree(server.store_dir, ignore_errors=True)
    floor = await _floor(messages, seed)
    lines.append(f"floor: the same {messages * len(SERVICES)} messages to the same server with no "
                 f"service running: {floor:.1f}s, {messages * len(SERVICES) / floor:.0f}/s")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.attacker", description=__doc__)
    parser.add_argument("--messages", type=int, default=GOAL, help="per service user")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    lines = asyncio.run(run(args.messages, args.seed))
    print("\n".join(lines))
    return 0 if not any(line.startswith("  changed") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
