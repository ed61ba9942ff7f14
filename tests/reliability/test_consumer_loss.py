"""A durable consumer with no leader for a moment (a JetStream leader election in a cluster, or
the durable removed by an operator): the services that consume Pod events must ride it out.

The server answers a pull request for a consumer that has no leader with status 503 (no
responders). Removing the durables reproduces that answer on a single server, deterministically.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.js import JetStreamContext

from schemas.names import STREAM_PODS, durable_name
from tests_support.reliability import Scene, scene

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

CONSUMERS = ("reclaimer", "gc")
RECREATE_SECONDS = 20.0  # several of the runners' 5 s long polls


async def test_consumers_survive_their_durable_losing_its_leader() -> None:
    async with scene() as sc:
        js = sc.rig.stack.nc.jetstream()
        for name in CONSUMERS:
            sc.rig.expect_exit(name)  # if it dies, the check below says so, not the supervisor
            await js.delete_consumer(STREAM_PODS, durable_name(name, sc.rig.stack.node))
        await durables_back(sc, js)
        pod = await sc.admit(None, "after")
        await sc.work.delete(pod)
        await sc.check_converged()


async def durables_back(sc: Scene, js: JetStreamContext) -> None:
    """Each consumer's durable exists again (its runner re-created it); fails at once when a
    consumer's process ended, and after the deadline otherwise."""
    end = time.monotonic() + RECREATE_SECONDS
    while True:
        dead = [f"{n}: status {sc.rig.child(n).status}" for n in CONSUMERS if not sc.rig.alive(n)]
        assert not dead, f"{dead}\n{sc.logs(CONSUMERS)}"
        present = {c.name for c in await js.consumers_info(STREAM_PODS)}
        if all(durable_name(n, sc.rig.stack.node) in present for n in CONSUMERS):
            return
        assert time.monotonic() < end, f"durables not re-created in {RECREATE_SECONDS:.0f}s"
        await asyncio.sleep(0.2)  # asked again until the deadline
