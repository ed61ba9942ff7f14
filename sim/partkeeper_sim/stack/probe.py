"""Fresh reads of what the demo checks: the simulated hardware, the claims, `partkeeper status`.

Every read fails loudly (a driver or store error propagates): the demo never takes a failed
read as "nothing there", for the same reason the services do not.
"""

from __future__ import annotations

import asyncio
from typing import Any

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.drivers.base import Instance
from partkeeper.status import gather
from partkeeper_sim.driver import SimDriver
from partkeeper_sim.stack.launch import Stack
from schemas import Claim
from schemas.names import BUCKET_CLAIMS


class Probe:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.driver = SimDriver(stack.layout.cluster.sim_state)
        self._store: ClaimsStore | None = None

    async def sim(self) -> dict[str, Any]:
        """`partkeeper sim list --json`, read under the state file's lock."""
        view: dict[str, Any] = await asyncio.to_thread(self.driver.list)
        return view

    async def instances(self) -> dict[str, dict[str, Any]]:
        """Every instance on the simulated cards by MIG UUID, with its card index."""
        return {
            inst["uuid"]: {**inst, "card": card["index"]}
            for card in (await self.sim())["cards"]
            for inst in card["instances"]
        }

    async def claims(self) -> list[Claim]:
        """Every claim of the node, from the claims bucket."""
        if self._store is None:
            bucket = await Bucket.open(self.stack.nc.jetstream(), BUCKET_CLAIMS)
            self._store = ClaimsStore(bucket, self.stack.node)
        docs = await self._store.read_all()
        return [claim for doc, _ in docs.values() for claim in doc.claims.values()]

    async def status(self) -> dict[str, Any]:
        """What `partkeeper status --json` prints."""
        return await gather(self.stack.node, (self.stack.nats_url,), auth=self.stack.auth)

    async def carve(self, card: int, profile: str) -> Instance:
        return await asyncio.to_thread(self.driver.carve, card, profile)

    async def set_busy(self, uuid: str, on: bool) -> Instance:
        return await asyncio.to_thread(self.driver.set_busy, uuid, on)

    async def fail_card(self, card: int, xid: int) -> None:
        """`partkeeper sim fail --card N --xid X`."""
        await asyncio.to_thread(self.driver.fail_card, card, xid)

    async def recover_card(self, card: int) -> None:
        """`partkeeper sim recover --card N`."""
        await asyncio.to_thread(self.driver.recover_card, card)

    async def destroy(self, instance: Instance) -> None:
        await asyncio.to_thread(self.driver.destroy, instance)
