"""The reclaimer tests' hands: the allocator's writes, a stand-in watcher, events, the audit log.

Claims are written with ClaimsStore + machine and instances created with the sim driver exactly as
the allocator does (write-ahead, create, activate, descriptor). `pods.get` is answered by a small
micro service serving a table, over real NATS request/reply.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.micro.service import Service

from partkeeper.bus import publish, serve
from partkeeper.bus.rpc import Endpoint
from partkeeper.claims import ClaimsStore, machine
from partkeeper.drivers import profiles
from partkeeper.drivers.base import Instance, InstanceSpec
from partkeeper.workdir import write_descriptor
from partkeeper_sim.driver import SimDriver
from schemas import (
    Claim,
    LiveInstance,
    PartitionEvent,
    PodFinished,
    PodGone,
    PodSeen,
    PodsGet,
    PodsGetReply,
    decode,
)
from schemas.names import (
    SERVICE_WATCHER,
    STREAM_PODS,
    durable_name,
    parts_filter,
    pods_get_subject,
    pods_subject,
)
from schemas.pods import PodState
from services.reclaimer.tuning import Tuning
from tests_support import until

# Short waits so a test sees the threshold, the slow retries and redeliveries in a second or two.
FAST = Tuning(
    destroy_threshold=3, fast_base=0.02, fast_cap=0.1, slow_base=0.1, slow_cap=0.3,
    event_patience=2.0, event_redelivery_cap=0.5, now_wait=5.0, watcher_timeout=1.0,
)
DEADLINE = 20.0  # a bound on waiting, never an expectation of how long anything takes
MODEL = "A100-40GB"
PROFILE = "1g.10gb"  # size 2, starts 0, 2, 4, 6


def new_uid() -> str:
    return str(uuid.uuid4())


@dataclass
class FakeWatcher:
    """Answers pods.get from a table (uid -> state); a UID not in it is `unknown`.

    `mode` "error" answers every question with a service error, "silent" never answers (it only
    counts), so "no answer means no action" can be checked pass by pass.
    """

    states: dict[str, PodState] = field(default_factory=dict)
    asked: Counter[str] = field(default_factory=Counter)
    fresh: list[str] = field(default_factory=list)
    mode: str = "table"
    service: Service | None = None
    sub: Subscription | None = None

    async def handle(self, req: PodsGet) -> PodsGetReply:
        self.asked[req.uid] += 1
        if req.fresh:
            self.fresh.append(req.uid)
        if self.mode == "error":
            raise RuntimeError("the API server is unreachable")
        state = self.states.get(req.uid, "unknown")
        return PodsGetReply(uid=req.uid, state=state, evidence=f"test table: {state}")

    async def start(self, nc: Client, node: str, mode: str = "table") -> FakeWatcher:
        await self.stop()
        self.mode = mode
        if mode == "silent":
            async def count(msg: Msg) -> None:
                self.asked[decode(msg.data, PodsGet).uid] += 1

            self.sub = await nc.subscribe(pods_get_subject(node), cb=count)
            return self
        endpoint = Endpoint("pods-get", pods_get_subject(node), PodsGet, self.handle)
        self.service = await serve(nc, name=SERVICE_WATCHER, version="0.0.0",
                                   description="test stand-in", endpoints=[endpoint])
        return self

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None
        if self.sub is not None:
            await self.sub.unsubscribe()
            self.sub = None


E = TypeVar("E", bound=PartitionEvent)


class AuditLog:
    """Every PK_PARTITIONS event of the node as the stream stores it: in publish order, with
    re-publications of one fact (the same Nats-Msg-Id) counted once."""

    def __init__(self) -> None:
        self.events: list[PartitionEvent] = []
        self.ids: set[str] = set()
        self.sub: Subscription | None = None

    async def start(self, nc: Client, node: str) -> AuditLog:
        async def take(msg: Msg) -> None:
            msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
            if msg_id and msg_id in self.ids:
                return
            self.ids.add(msg_id)
            self.events.append(decode(msg.data, PartitionEvent))

        self.sub = await nc.subscribe(parts_filter(node), cb=take)
        return self

    async def stop(self) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()

    def of(self, kind: type[E], **match: object) -> list[E]:
        return [e for e in self.events
                if isinstance(e, kind) and all(getattr(e, k) == v for k, v in match.items())]

    async def wait(self, kind: type[E], **match: object) -> list[E]:
        """The matching events, once at least one has arrived (stored events arrive in order)."""
        await until(lambda: bool(self.of(kind, **match)), f"{kind.__name__} {match} audited")
        return self.of(kind, **match)


@dataclass
class Hands:
    """Acting as the allocator, the watcher's publisher and an observer of the hardware."""

    js: JetStreamContext
    store: ClaimsStore
    driver: SimDriver
    pods_dir: Path
    node: str

    async def begin(self, uid: str, *, card: int = 0, start: int = 0, profile: str = PROFILE,
                    container: str = "main") -> Claim:
        now = time.time()
        cid = uuid.uuid4().hex[:12]
        size = profiles.model(MODEL).profiles[profile].size
        claim = Claim(
            id=cid, state="creating", pod_uid=uid, namespace="default", name=f"pod-{uid[:8]}",
            container=container, resource=f"nvidia.com/mig-{profile}", device_ids=[cid],
            card=card, profile=profile, start=start, size=size, created_at=now, updated_at=now,
        )
        await self.store.update(card, lambda d: machine.begin(d, claim))
        return claim

    async def create(self, claim: Claim) -> Instance:
        spec = InstanceSpec(claim.card, claim.profile, claim.start)
        return await asyncio.to_thread(self.driver.create, spec)

    async def allocate(self, uid: str, *, card: int = 0, start: int = 0, profile: str = PROFILE,
                       container: str = "main") -> tuple[Claim, Instance]:
        """Write-ahead claim, create, activate, descriptor: what a successful Allocate leaves."""
        claim = await self.begin(uid, card=card, start=start, profile=profile, container=container)
        inst = await self.create(claim)
        live = LiveInstance(gi_id=inst.gi_id, ci_id=inst.ci_id, uuid=inst.uuid)
        await self.store.update(claim.card,
                                lambda d: machine.activate(d, claim.id, live, time.time()))
        body = json.dumps({"uuid": inst.uuid, "claim": claim.id}).encode()
        await asyncio.to_thread(write_descriptor, self.pods_dir, uid, claim.container, inst.uuid,
                                body)
        return await self.current(claim), inst

    def descriptor(self, claim: Claim, inst: Instance) -> Path:
        name = f"partition-{inst.uuid}.json"
        return self.pods_dir / claim.pod_uid / f"c-{claim.container}" / name

    async def claim(self, claim: Claim) -> Claim | None:
        doc, _ = await self.store.read(claim.card)
        return doc.claims.get(claim.id)

    async def current(self, claim: Claim) -> Claim:
        """`claim` as the store holds it now, failing the test when it was removed."""
        now = await self.claim(claim)
        if now is None:
            raise AssertionError(f"claim {claim.id} of Pod {claim.pod_uid} was removed")
        return now

    async def removed(self, claim: Claim) -> bool:
        return await self.claim(claim) is None

    async def instances(self, card: int) -> list[Instance]:
        return await asyncio.to_thread(self.driver.instances, card)

    async def exists(self, inst: Instance) -> bool:
        return inst in await self.instances(inst.card)

    async def gone(self, uid: str, *, msg_id: str | None = None) -> int:
        event = PodGone(node=self.node, uid=uid, namespace="default", name=f"pod-{uid[:8]}",
                        resource_version="9", observed_at=time.time(), evidence="deleted")
        ack = await publish(self.js, pods_subject(self.node, uid), event,
                            msg_id=msg_id or f"PodGone/{uid}")
        return ack.seq

    async def finished(self, uid: str, *, msg_id: str | None = None) -> int:
        event = PodFinished(node=self.node, uid=uid, namespace="default", name=f"pod-{uid[:8]}",
                            resource_version="8", observed_at=time.time(), phase="Succeeded")
        ack = await publish(self.js, pods_subject(self.node, uid), event,
                            msg_id=msg_id or f"PodFinished/{uid}")
        return ack.seq

    async def seen(self, uid: str) -> int:
        event = PodSeen(node=self.node, uid=uid, namespace="default", name=f"pod-{uid[:8]}",
                        resource_version="10", observed_at=time.time(), phase="Running")
        ack = await publish(self.js, pods_subject(self.node, uid), event,
                            msg_id=f"PodSeen/{uid}/{uuid.uuid4().hex}")
        return ack.seq

    async def acked(self, seq: int) -> bool:
        """Whether the reclaimer's durable consumer has acknowledged everything up to `seq`."""
        info = await self.js.consumer_info(STREAM_PODS, durable_name("reclaimer", self.node))
        return info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0

    async def unacked(self) -> int:
        info = await self.js.consumer_info(STREAM_PODS, durable_name("reclaimer", self.node))
        return int(info.num_ack_pending or 0)
