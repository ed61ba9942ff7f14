"""The reclaimer's entries in the PK_PARTITIONS audit log.

Each step is published after it is durable, with a msg id naming the fact, so a retried publish is
dropped by the stream's duplicate window. A publish that fails is kept and retried before the next
step or pass, so a NATS hiccup delays the audit rather than losing it (within this process).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import msgspec
from nats.js import JetStreamContext

from partkeeper.bus import publish
from partkeeper.claims import ClaimsStore
from partkeeper.drivers.base import Instance
from schemas import Claim, DestroyFailed, ForeignFound, ForeignGone
from schemas.names import parts_subject

log = logging.getLogger(__name__)
MAX_PENDING = 10_000  # beyond this the oldest unpublished entries are dropped, and logged


class Audit:
    def __init__(self, js: JetStreamContext, node: str, store: ClaimsStore | None = None) -> None:
        self.js = js
        self.node = node
        self.store = store  # the claims outbox, flushed with the rest
        self.pending: deque[tuple[str, msgspec.Struct, str]] = deque()
        self._order = asyncio.Lock()  # one flusher at a time keeps the log in step order

    async def emit(self, card: int | None, event: msgspec.Struct, msg_id: str) -> None:
        """Publish now, or keep it for `flush` if NATS does not take it."""
        self.pending.append((parts_subject(self.node, card), event, msg_id))
        while len(self.pending) > MAX_PENDING:
            _, lost, lost_id = self.pending.popleft()
            log.error("audit backlog full; dropped %s %s", type(lost).__name__, lost_id)
        await self.flush()

    async def flush(self, *, outbox: bool = False) -> None:
        """Send what this process kept; with `outbox` (each reconcile pass) also the claims
        outbox: transitions any process of the node left unannounced (claims/outbox.py)."""
        if outbox and self.store is not None:
            try:
                await self.store.flush_outbox()
            except Exception as exc:
                log.warning("the claims outbox could not be read; sent at a later pass: %s", exc)
        async with self._order:
            while self.pending:
                subject, event, msg_id = self.pending[0]
                try:
                    await publish(self.js, subject, event, msg_id=msg_id)
                except Exception as exc:
                    log.warning("audit publish of %s deferred: %s", msg_id, exc)
                    return
                self.pending.popleft()

    async def destroy_failed(
        self, claim: Claim, instance_uuid: str, kind: str, message: str, attempts: int
    ) -> None:
        event = DestroyFailed(
            node=self.node, at=time.time(), card=claim.card, claim_id=claim.id,
            pod_uid=claim.pod_uid, instance_uuid=instance_uuid, reason=kind, message=message,
            attempts=attempts,
        )
        await self.emit(claim.card, event, f"destroy-failed/{claim.id}/{attempts}")

    async def foreign_found(self, inst: Instance, since: float) -> None:
        event = ForeignFound(
            node=self.node, at=time.time(), card=inst.card, instance_uuid=inst.uuid,
            profile=inst.profile, start=inst.start, size=inst.size,
        )
        await self.emit(inst.card, event, _foreign_id(self.node, inst, since, "found"))

    async def foreign_gone(self, inst: Instance, since: float, *, reaped: bool) -> None:
        event = ForeignGone(
            node=self.node, at=time.time(), card=inst.card, instance_uuid=inst.uuid, reaped=reaped
        )
        await self.emit(inst.card, event, _foreign_id(self.node, inst, since, "gone"))


def _foreign_id(node: str, inst: Instance, since: float, what: str) -> str:
    # Name-based MIG UUIDs repeat across nodes and across successive carvings, so the id names
    # the node and the sighting, not only the instance.
    return f"foreign/{node}/{inst.card}/{inst.uuid}/{inst.gi_id}/{since:.3f}/{what}"
