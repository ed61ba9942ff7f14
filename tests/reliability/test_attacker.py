"""The seeded randomized attacker (tests_support/attacker.py) against the four real services of
`sim-node-0` on a real nats-server with the shipped permissions, another node's records beside
them. CI runs a short seed; `python -m bench.attacker` runs 10,000 messages per user
(docs/benchmarks.md)."""

from __future__ import annotations

import os

import pytest

from partkeeper_sim.stack.launch import SERVICES
from partkeeper_sim.stack.natsserver import EmbeddedUsers, NatsServer
from tests_support.attacker import Before, attack_all, seed_other_node
from tests_support.reliability import scene

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]

SEED = int(os.environ.get("PK_ATTACK_SEED", "33"))
PER_USER = int(os.environ.get("PK_ATTACK_MESSAGES", "150"))
RESTARTED = b"starting it again"  # runtime.py: a service body that ended, started again


async def test_one_nodes_credentials_reach_no_further_than_the_node(server: NatsServer) -> None:
    async with scene(servers=[server], users=EmbeddedUsers.shipped()) as sc:
        js = sc.rig.stack.nc.jetstream()
        await seed_other_node(js)
        held = await sc.admit("1g.10gb", "held")
        before = await Before.take(js)

        tally = await attack_all(server.url, PER_USER, SEED)

        assert sum(tally.sent.values()) >= PER_USER * len(SERVICES) * 0.9, tally
        problems = await before.check(js)
        assert not problems, f"seed {SEED}: {problems}\n{sc.logs()}"
        sc.all_alive()
        for name in SERVICES:
            log = sc.rig.layout.log(name).read_bytes()
            assert RESTARTED not in log, f"seed {SEED}: {name} restarted\n{sc.logs([name], 40)}"
        # a Pod lifecycle still passes, and the one admitted before is intact
        after = await sc.admit("2g.20gb", "after")
        for pod in (held, after):
            await sc.work.delete(pod)
        await sc.check_converged()
