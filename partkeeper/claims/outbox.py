"""The claims store as the outbox of the audit log: pure functions over a card's document.

Every claim transition a store writes (created, activated, released, removed) becomes a
`ClaimChanged` in the document's `outbox`, in the same compare-and-set as the transition, so a
transition and the fact that it must be announced are durable together. The store publishes the
outbox after the write and strips what was published at its next write of the card (or at a
`flush`), so nothing recorded in a claim can be missing from PK_PARTITIONS once the bus answers
again: a crash, a NATS restart or a refused publish only delays it. Each entry keeps its message
id (`claim/<id>/<state>`, the one the services have always used), so the stream's duplicate window
(schemas.names: PK_PARTITIONS) drops a re-send of an entry that did land.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

import msgspec

from schemas import CardClaims, Claim, ClaimChanged
from schemas.documents import Unpublished
from schemas.events import ClaimState

log = logging.getLogger(__name__)

MAX_ENTRIES = 256  # per card; beyond it the oldest are dropped (and said so): a bounded document


def msg_id(claim_id: str, state: str, remakes: int = 0) -> str:
    """A re-made claim (after a reboot) goes through its states again: its entries carry the
    count of re-makes, so the duplicate window does not take them for re-sends."""
    if remakes:
        return f"claim/{claim_id}/{remakes}/{state}"
    return f"claim/{claim_id}/{state}"


def _event(claim: Claim, state: ClaimState, now: float, *, reason: str = "") -> Unpublished:
    instance = claim.instance.uuid if claim.instance else None
    event = ClaimChanged(
        node="", at=now, card=claim.card, claim_id=claim.id, pod_uid=claim.pod_uid,
        namespace=claim.namespace, name=claim.name, container=claim.container,
        profile=claim.profile, start=claim.start, size=claim.size, state=state,
        instance_uuid=instance, reason=reason,
    )
    return Unpublished(msg_id=msg_id(claim.id, state, claim.remakes), event=event)


def transitions(old: CardClaims, new: CardClaims, now: float,
                reasons: Mapping[str, str] | None = None) -> list[Unpublished]:
    """The state changes from `old` to `new`, as audit entries (a pure diff of two documents).

    A changed instance or attempt count alone is no transition. `reasons` (by claim id) is why
    the writer made this write's transition, where the documents cannot say it: a removed claim
    is gone from `new`, and its release reason is why it was released, not why it was removed
    (e.g. its instance was destroyed, or MIG mode was switched off under it)."""
    why = reasons or {}
    found: list[Unpublished] = []
    for claim_id, claim in new.claims.items():
        before = old.claims.get(claim_id)
        if before is not None and before.state == claim.state:
            continue
        reason = claim.release_reason if claim.state == "releasing" else ""
        found.append(_event(claim, claim.state, now, reason=why.get(claim_id, reason)))
    for claim_id, claim in old.claims.items():
        if claim_id not in new.claims:
            reason = claim.release_reason if claim.state == "releasing" else \
                "abandoned before it was activated"
            found.append(_event(claim, "removed", now, reason=why.get(claim_id, reason)))
    return [msgspec.structs.replace(e, event=msgspec.structs.replace(e.event, node=new.node))
            for e in found]


def record(old: CardClaims, new: CardClaims, published: Collection[str],
           now: float, reasons: Mapping[str, str] | None = None) -> CardClaims:
    """`new` with its outbox: the entries not yet `published`, then this write's transitions."""
    kept = [e for e in old.outbox if e.msg_id not in published]
    added = [e for e in transitions(old, new, now, reasons)
             if e.msg_id not in {k.msg_id for k in kept}]
    entries = kept + added
    if len(entries) > MAX_ENTRIES:
        dropped = entries[: len(entries) - MAX_ENTRIES]
        log.error("audit outbox of card %d full: dropped %s", new.card,
                  ", ".join(e.msg_id for e in dropped), extra={"card": new.card})
        entries = entries[len(dropped):]
    if entries == list(new.outbox):
        return new
    return msgspec.structs.replace(new, outbox=entries)


def strip(doc: CardClaims, published: Collection[str]) -> CardClaims:
    """`doc` without the entries known to be on the audit log (the same object if none)."""
    kept = [e for e in doc.outbox if e.msg_id not in published]
    if len(kept) == len(doc.outbox):
        return doc
    return msgspec.structs.replace(doc, outbox=kept)
