"""The node's card health in the allocator, both modes: what a fault takes out of the offer, and
who is told.

One `CardWatch` per node runs here (the allocator owns capacity). On every change of what is
failed it stores the fold in the `Context` (the snapshots read it: placement skips a failed card,
its free room counts for no token, its claims' tokens turn Unhealthy, its DRA devices are tainted
or withdrawn), wakes the recompute, and tells the Pods: one `CardUnhealthy` audit entry per Pod
with a partition on the failed card (an instance-level fault: only that Pod), on the allocator's
node-wide subject, which the watcher turns into a `PartitionCardUnhealthy` Warning Event.

Nothing here writes a claim or calls create or destroy (docs/operations.md, "A failed card": a
health event never destroys a partition, releases a live Pod's claim or makes an instance look
foreign). A
recovered card is offered again by the next recompute, which reads claims and instances afresh
as at start: what is still covered stays covered.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from typing import Literal

from partkeeper.bus import publish
from partkeeper.cardwatch import CardWatch
from partkeeper.claims import StoreReadError
from partkeeper.drivers.cardhealth import CardEvent, CardHealth, EventSource, Fault, Scope
from schemas import CardHealthChanged, CardUnhealthy, Claim
from schemas.names import parts_subject
from services.allocator.core.state import Context

log = logging.getLogger(__name__)


def told(fault: Fault, claims: Iterable[Claim]) -> list[Claim]:
    """The claims whose Pods hear of `fault` (pure): on a card fault every claim on that card
    not already on its way out; on an instance fault the claim whose partition it is."""
    if fault.scope not in (Scope.CARD, Scope.INSTANCE):
        return []
    found = []
    for claim in claims:
        if claim.card != fault.card or claim.state == "releasing":
            continue
        if fault.scope is Scope.INSTANCE:
            inst = claim.instance
            if inst is None or (inst.gi_id, inst.ci_id) != fault.instance:
                continue
        found.append(claim)
    return sorted(found, key=lambda c: c.id)


def entry(node: str, fault: Fault, event: CardEvent, claim: Claim, at: float) -> CardUnhealthy:
    return CardUnhealthy(
        node=node, at=at, card=fault.card, cause=fault.cause,
        xid=event.xid if fault.cause.startswith("xid-") or fault.cause == "lost" else 0,
        meaning=fault.meaning, scope="instance" if fault.scope is Scope.INSTANCE else "card",
        claim_id=claim.id, pod_uid=claim.pod_uid, namespace=claim.namespace, name=claim.name,
        instance_uuid=claim.instance.uuid if claim.instance is not None else "",
    )


class Health:
    """The allocator's card watch and what it does on a change."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.watch = CardWatch(self._open, ctx.config.xid_policy(), self.changed)
        self.told = 0  # audit entries published (tests)

    def _open(self) -> EventSource | None:
        return self.ctx.driver.events()

    async def run(self) -> None:
        await self.watch.run()

    async def changed(self, health: CardHealth, fault: Fault, event: CardEvent) -> None:
        self.ctx.health = health
        if fault.scope is Scope.RECOVERED:
            self.ctx.lost.discard(fault.card)
        self.ctx.changes.touch()  # the recompute pushes the new lists within its usual bound
        if fault.scope in (Scope.CARD, Scope.RECOVERED):
            await self._note(health, fault)
        if fault.scope in (Scope.CARD, Scope.INSTANCE):
            await self._tell(fault, event)

    async def _note(self, health: CardHealth, fault: Fault) -> None:
        """The card's new state, for the watcher's note on the Node."""
        now = health.card_fault(fault.card)
        state: Literal["ok", "failed", "lost"] = "ok"
        if now is not None:
            state = "lost" if now.cause == "lost" else "failed"
        at = time.time()
        message = CardHealthChanged(node=self.ctx.node, at=at, card=fault.card, health=state,
                                    cause=now.cause if now else "",
                                    meaning=now.meaning if now else "")
        try:
            await publish(self.ctx.js, parts_subject(self.ctx.node, None), message,
                          msg_id=f"card-health/{fault.card}/{state}/{at:.6f}")
        except Exception as exc:
            log.warning("could not publish card %d's health (%s): %s", fault.card, state, exc)

    async def _tell(self, fault: Fault, event: CardEvent) -> None:
        try:
            doc, _ = await self.ctx.store.read(fault.card)
        except StoreReadError as exc:
            log.warning("card %d failed (%s) but its claims could not be read (%s): its Pods are "
                        "not told", fault.card, fault.cause, exc)
            return
        at = time.time()
        js = self.ctx.js
        for claim in told(fault, doc.claims.values()):
            message = entry(self.ctx.node, fault, event, claim, at)
            fact = f"{claim.id}\n{fault.card}\n{fault.cause}\n{at:.6f}"
            msg_id = f"card-unhealthy/{hashlib.sha256(fact.encode()).hexdigest()[:32]}"
            try:
                await publish(js, parts_subject(self.ctx.node, None), message, msg_id=msg_id)
            except Exception as exc:
                log.warning("could not tell Pod %s that card %d failed: %s", claim.pod_uid,
                            fault.card, exc, extra={"pod_uid": claim.pod_uid})
                continue
            self.told += 1
            log.warning("Pod %s/%s (claim %s) told that card %d failed: %s", claim.namespace,
                        claim.name, claim.id, fault.card, fault.meaning,
                        extra={"pod_uid": claim.pod_uid, "card": fault.card,
                               "claim_id": claim.id})
