"""Stand-ins for the allocator's peers, served over real NATS request/reply.

`TableWatcher` answers `pods.pending` and `pods.get` from two tables, as the watcher would: `view`
(what it has published, also written to `pk-pods`, which the allocator mirrors) and `truth` (what
the API server says; a `fresh` question reads it and brings the view up to date). A test makes the
watcher lag by changing only the truth.

`TableReclaimer` answers `reclaim.now` as docs/protocol.md says: for each claim, a fresh
`pods.get`; only `finished`/`gone` lets it release, destroy (sim driver) and remove the claim
through ClaimsStore + machine; anything else is refused with a reason.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.js.kv import KeyValue
from nats.micro.service import Service

from partkeeper.bus import NoAnswer, request, serve
from partkeeper.bus.rpc import Endpoint
from partkeeper.claims import ClaimsStore, inventory, machine
from partkeeper.drivers import Driver
from partkeeper.podstate import is_dead
from schemas import (
    Claim,
    ContainerRequest,
    PendingPodsQuery,
    PendingPodsReply,
    PodRecord,
    PodsGet,
    PodsGetReply,
    ReclaimNow,
    ReclaimNowReply,
    ReclaimOutcome,
    encode,
)
from schemas.names import (
    SERVICE_RECLAIMER,
    SERVICE_WATCHER,
    pods_get_subject,
    pods_key,
    pods_pending_subject,
    reclaim_now_subject,
)


@dataclass
class TableWatcher:
    nc: Client
    pods_kv: KeyValue
    node: str
    view: dict[str, PodRecord] = field(default_factory=dict)
    truth: dict[str, PodRecord] = field(default_factory=dict)
    fresh_asked: list[str] = field(default_factory=list)
    service: Service | None = None
    _seq: int = 0

    async def start(self) -> TableWatcher:
        self.service = await serve(self.nc, name=SERVICE_WATCHER, version="0.0.0",
                                   description="test stand-in", endpoints=[
            Endpoint("pods-pending", pods_pending_subject(self.node), PendingPodsQuery,
                     self._pending),
            Endpoint("pods-get", pods_get_subject(self.node), PodsGet, self._get),
        ])
        return self

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None

    def record(self, uid: str, name: str, containers: dict[str, dict[str, int]]) -> PodRecord:
        self._seq += 1
        return PodRecord(
            node=self.node, uid=uid, namespace="default", name=name, phase="Pending",
            state="live", created=f"2026-01-01T00:00:{self._seq:02d}Z",
            containers=[ContainerRequest(name=c, requests=r) for c, r in containers.items()],
            resource_version=str(self._seq), evidence="test table", updated_at=time.time(),
        )

    async def add(self, record: PodRecord) -> None:
        self.truth[record.uid] = record
        await self.publish(record)

    async def publish(self, record: PodRecord) -> None:
        """What the watcher has seen becomes its view (and the pk-pods record)."""
        self.view[record.uid] = record
        await self.pods_kv.put(pods_key(self.node, record.uid), encode(record))

    async def change(self, uid: str, *, lag: bool = False, **fields: object) -> PodRecord:
        """Change the truth; unless `lag`, the watcher sees it at once (view and pk-pods)."""
        self._seq += 1
        record = msgspec.structs.replace(self.truth[uid], resource_version=str(self._seq),
                                         **fields)
        self.truth[uid] = record
        if not lag:
            await self.publish(record)
        return record

    async def finish(self, uid: str, *, lag: bool = False) -> PodRecord:
        return await self.change(uid, lag=lag, phase="Succeeded", state="finished")

    async def gone(self, uid: str, *, lag: bool = False) -> PodRecord:
        return await self.change(uid, lag=lag, state="gone", evidence="deleted")

    async def _pending(self, query: PendingPodsQuery) -> PendingPodsReply:
        if query.fresh:
            for record in self.truth.values():
                await self.publish(record)
        pods = [
            r for r in self.view.values()
            if r.state == "live" and r.phase == "Pending" and not r.deleting
            and any(c.requests.get(query.resource) == query.quantity for c in r.containers)
        ]
        pods.sort(key=lambda r: (r.created, r.namespace, r.name))
        return PendingPodsReply(pods=pods, resource_version=str(self._seq))

    async def _get(self, query: PodsGet) -> PodsGetReply:
        if query.fresh:
            self.fresh_asked.append(query.uid)
            if query.uid in self.truth:
                await self.publish(self.truth[query.uid])
        record = self.view.get(query.uid)
        if record is None:
            return PodsGetReply(uid=query.uid, state="unknown", evidence="never seen")
        return PodsGetReply(uid=query.uid, state=record.state, evidence=record.evidence,
                            resource_version=record.resource_version, pod=record)


@dataclass
class TableReclaimer:
    nc: Client
    store: ClaimsStore
    driver: Driver
    node: str
    cards: list[int]
    asked: list[list[str]] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    service: Service | None = None

    async def start(self) -> TableReclaimer:
        self.service = await serve(self.nc, name=SERVICE_RECLAIMER, version="0.0.0",
                                   description="test stand-in", endpoints=[
            Endpoint("reclaim-now", reclaim_now_subject(self.node), ReclaimNow, self._now),
        ])
        return self

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None

    async def find(self, claim_id: str) -> Claim | None:
        for card in self.cards:
            doc, _ = await self.store.read(card)
            if claim_id in doc.claims:
                return doc.claims[claim_id]
        return None

    async def _now(self, body: ReclaimNow) -> ReclaimNowReply:
        self.asked.append(list(body.claim_ids))
        return ReclaimNowReply(outcomes=[await self._one(cid) for cid in body.claim_ids])

    async def _one(self, claim_id: str) -> ReclaimOutcome:
        claim = await self.find(claim_id)
        if claim is None:
            return ReclaimOutcome(claim_id=claim_id, done=False, reason="unknown claim")
        try:
            answer = await request(self.nc, pods_get_subject(self.node),
                                   PodsGet(uid=claim.pod_uid, fresh=True), PodsGetReply)
        except NoAnswer as exc:
            return ReclaimOutcome(claim_id=claim_id, done=False, reason=str(exc))
        if not is_dead(answer.state):
            return ReclaimOutcome(claim_id=claim_id, done=False, reason=f"Pod is {answer.state}")
        await self.reclaim(claim)
        return ReclaimOutcome(claim_id=claim_id, done=True, reason=f"Pod is {answer.state}")

    async def reclaim(self, claim: Claim) -> None:
        """release -> destroy -> remove, as the event path does."""
        await self.store.update(claim.card,
                                lambda d: machine.release(d, claim.id, "test", time.time()))
        if claim.kind == "partition":
            doc, _ = await self.store.read(claim.card)
            instances = await asyncio.to_thread(self.driver.instances, claim.card)
            inv = inventory.classify(doc, instances, self.driver.same_partition)
            inst = inv.owned.get(claim.id) or inv.unrecorded.get(claim.id)
            if inst is not None:
                await asyncio.to_thread(self.driver.destroy, inst)
                self.destroyed.append(inst.uuid)
        await self.store.update(claim.card, lambda d: machine.remove(d, claim.id))
