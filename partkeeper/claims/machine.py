"""The claim state machine as pure functions over a card's claims document.

    creating --activate--> active --release--> releasing --remove--> (removed)
        \\--release (Pod gone while creating)--^        ^
         \\--abandon (allocator undoes its own never-activated create)

Every function returns a new document or raises TransitionError naming the claim and the states;
none performs I/O. An unknown state is an error, never a default.
"""

from __future__ import annotations

import msgspec

from partkeeper.drivers.profiles import overlaps
from schemas import CardClaims, Claim, LiveInstance

ALLOWED: dict[str, frozenset[str]] = {
    "creating": frozenset({"active", "releasing", "removed"}),
    "active": frozenset({"releasing"}),
    "releasing": frozenset({"releasing", "removed"}),
}


class TransitionError(ValueError):
    """A transition the state machine does not allow, or a claim that is not where it should be."""


def _get(doc: CardClaims, claim_id: str) -> Claim:
    try:
        return doc.claims[claim_id]
    except KeyError:
        raise TransitionError(f"claim {claim_id} is not on card {doc.card}") from None


def _check(claim: Claim, target: str) -> None:
    allowed = ALLOWED.get(claim.state)
    if allowed is None:
        raise TransitionError(f"claim {claim.id} is in unknown state {claim.state!r}")
    if target not in allowed:
        raise TransitionError(f"claim {claim.id} cannot go from {claim.state} to {target}")


def _with(doc: CardClaims, claim: Claim) -> CardClaims:
    return msgspec.structs.replace(doc, claims={**doc.claims, claim.id: claim})


def begin(doc: CardClaims, claim: Claim) -> CardClaims:
    """Add a new `creating` claim, refusing one whose placement overlaps any existing claim."""
    if claim.state != "creating":
        raise TransitionError(f"claim {claim.id} must begin as creating, not {claim.state}")
    if claim.id in doc.claims:
        raise TransitionError(f"claim {claim.id} already exists on card {doc.card}")
    if claim.card != doc.card:
        raise TransitionError(f"claim {claim.id} is for card {claim.card}, not {doc.card}")
    for other in doc.claims.values():
        if other.kind == claim.kind and overlaps(
            (claim.start, claim.size), (other.start, other.size)
        ):
            raise TransitionError(
                f"claim {claim.id} at {claim.start}+{claim.size} overlaps claim {other.id} "
                f"({other.state}) at {other.start}+{other.size} on card {doc.card}"
            )
    return _with(doc, claim)


def activate(doc: CardClaims, claim_id: str, instance: LiveInstance, now: float) -> CardClaims:
    """creating -> active, recording the live identity the driver reported."""
    claim = _get(doc, claim_id)
    _check(claim, "active")
    active = msgspec.structs.replace(claim, state="active", instance=instance, updated_at=now)
    return _with(doc, active)


def activate_slice(doc: CardClaims, claim_id: str, now: float) -> CardClaims:
    """creating -> active for a logical slice, which has no hardware identity to record."""
    claim = _get(doc, claim_id)
    if claim.kind != "slice":
        raise TransitionError(
            f"claim {claim_id} is a {claim.kind}; only a slice is activated without an instance"
        )
    _check(claim, "active")
    return _with(doc, msgspec.structs.replace(claim, state="active", updated_at=now))


def record_instance(
    doc: CardClaims, claim_id: str, instance: LiveInstance, now: float
) -> CardClaims:
    """Record the live identity on a claim that was released while its create was under way."""
    claim = _get(doc, claim_id)
    if claim.state not in ("creating", "releasing"):
        raise TransitionError(f"claim {claim_id} is {claim.state}; its instance is already known")
    return _with(doc, msgspec.structs.replace(claim, instance=instance, updated_at=now))


def release(doc: CardClaims, claim_id: str, reason: str, now: float) -> CardClaims:
    """active or creating -> releasing. Idempotent on a releasing claim (keeps its reason)."""
    claim = _get(doc, claim_id)
    _check(claim, "releasing")
    if claim.state == "releasing":
        return doc
    released = msgspec.structs.replace(
        claim, state="releasing", release_reason=reason, updated_at=now
    )
    return _with(doc, released)


def count_attempt(doc: CardClaims, claim_id: str, now: float) -> CardClaims:
    """One more failed destroy of a releasing claim."""
    claim = _get(doc, claim_id)
    if claim.state != "releasing":
        raise TransitionError(f"claim {claim_id} is {claim.state}, not releasing")
    bumped = msgspec.structs.replace(
        claim, release_attempts=claim.release_attempts + 1, updated_at=now
    )
    return _with(doc, bumped)


def remove(doc: CardClaims, claim_id: str, *, abandon: bool = False) -> CardClaims:
    """releasing -> removed, or (abandon=True) creating -> removed for the allocator's own undo."""
    claim = _get(doc, claim_id)
    if abandon:
        if claim.state not in ("creating", "releasing") or claim.instance is not None:
            raise TransitionError(
                f"claim {claim_id} is {claim.state}; only a never-activated one is abandoned"
            )
    elif claim.state != "releasing":
        raise TransitionError(
            f"claim {claim_id} is {claim.state}; only releasing claims are removed"
        )
    rest = {k: v for k, v in doc.claims.items() if k != claim_id}
    return msgspec.structs.replace(doc, claims=rest)


def empty(node: str, card: int) -> CardClaims:
    return CardClaims(node=node, card=card, claims={})
