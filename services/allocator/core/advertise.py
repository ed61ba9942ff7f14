"""What the allocator advertises: token health per resource and the capacity document (pure).

A function of one snapshot: the same claims, instances and Pod states always give the same
lists. Occupied = claims (any state) union physical instances, foreign ones included, so a slot
is advertised free only when nothing covers it (invariant 5). A failed card (DESIGN.md, "Card
health") offers nothing: its free room counts for no token, and the tokens its claims hold are
Unhealthy (as are those of a partition that failed by itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from schemas import Claim, NodeCapacity
from schemas.documents import CardView, InstanceView, ResourceCapacity
from services.allocator.core import capacity, tokens
from services.allocator.core.catalog import Offer
from services.allocator.core.placement import Snapshot


@dataclass(frozen=True, slots=True)
class Advert:
    health: dict[str, dict[str, bool]]  # resource -> token -> Healthy
    capacity: NodeCapacity


def advertise(offers: Mapping[str, Offer], snap: Snapshot, node: str, now: float) -> Advert:
    claims = snap.claims
    instances = snap.all_instances
    failed = snap.failed
    health: dict[str, dict[str, bool]] = {}
    resources: dict[str, ResourceCapacity] = {}
    for offer in offers.values():
        free = sum(capacity.free_per_card(offer, claims, instances, failed).values())
        held = tokens.holds(claims, offer.resource, snap.is_dead, snap.claim_failed)
        health[offer.resource] = tokens.health(offer.tokens, held, free)
        healthy = sum(health[offer.resource].values())
        resources[offer.resource] = ResourceCapacity(
            total=len(offer.tokens), healthy=healthy, unhealthy=len(offer.tokens) - healthy,
            free=free,
        )
    per_card = capacity.by_card(offers, claims, instances, failed)
    doc = NodeCapacity(
        node=node,
        at=now,
        resources=resources,
        free_per_card={str(card): free for card, free in sorted(per_card.items())},
        cards=[_card_view(snap, index, per_card.get(index, {})) for index in sorted(snap.cards)],
    )
    return Advert(health, doc)


def _card_view(snap: Snapshot, index: int, free: dict[str, int]) -> CardView:
    card = snap.cards[index]
    doc = snap.docs[index]
    inv = snap.inventory(index)
    owner = {(i.uuid, i.gi_id): cid for cid, i in (*inv.owned.items(), *inv.unrecorded.items())}
    views = [
        InstanceView(
            uuid=i.uuid, profile=i.profile, start=i.start, size=i.size, gi_id=i.gi_id,
            foreign=(i.uuid, i.gi_id) not in owner, claim_id=owner.get((i.uuid, i.gi_id)),
        )
        for i in snap.instances.get(index, ())
    ]
    fault = snap.health.card_fault(index)
    state: Literal["ok", "failed", "lost"] = "ok"
    if index in snap.lost or (fault is not None and fault.cause == "lost"):
        state = "lost"
    elif fault is not None:
        state = "failed"
    broken = sorted(i.uuid for i in snap.instances.get(index, ())
                    if snap.health.instance_fault(index, i.gi_id, i.ci_id) is not None)
    return CardView(
        index=index, uuid=card.uuid, model=card.model, mode=card.mode, instances=views,
        free=dict(sorted(free.items())),
        pending_reclaims=sum(1 for c in doc.claims.values() if _pending(c, snap)),
        health=state,
        cause=fault.cause if fault is not None else ("lost" if state == "lost" else ""),
        meaning=fault.meaning if fault is not None else (
            "the card stopped answering (GPU is lost)" if state == "lost" else ""),
        failed_instances=broken,
    )


def _pending(claim: Claim, snap: Snapshot) -> bool:
    return claim.state == "releasing" or snap.is_dead(claim.pod_uid)


def same(a: NodeCapacity, b: NodeCapacity | None) -> bool:
    """Equal but for the time stamp: no need to publish again."""
    return b is not None and (a.resources, a.free_per_card, a.cards, a.slice_limiter) == (
        b.resources, b.free_per_card, b.cards, b.slice_limiter,
    )
