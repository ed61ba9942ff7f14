"""The claim state machine as pure functions over a card's claims document.

    creating --activate--> active --release--> releasing --remove--> (removed)
        \\--release (Pod gone while creating)--^        ^
         \\--abandon (allocator undoes its own never-activated create)

    after a host reboot (`after_boot` marks every partition claim `rebooted`: its partition is gone)
    rebooted creating/active --remake--> creating (no instance; at the placement the shell chose)
    rebooted releasing --remove--> (removed; the reclaimer has nothing to destroy)

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
    _refuse_overlap(doc, claim)
    return _with(doc, claim)


def _refuse_overlap(doc: CardClaims, claim: Claim) -> None:
    """A claim's placement must overlap no other claim of its kind, except one a reboot removed
    the partition of: that one holds no room until it is re-made (`remake` checks again then)."""
    for other in doc.claims.values():
        if other.id == claim.id or other.kind != claim.kind or other.rebooted:
            continue
        if overlaps((claim.start, claim.size), (other.start, other.size)):
            raise TransitionError(
                f"claim {claim.id} at {claim.start}+{claim.size} overlaps claim {other.id} "
                f"({other.state}) at {other.start}+{other.size} on card {doc.card}"
            )


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


def after_boot(doc: CardClaims, boot_id: str) -> CardClaims:
    """The document as a service starting under the host's boot `boot_id` finds it.

    The same boot (a plain restart): unchanged. No boot recorded (a new document, or one an
    earlier version wrote, whose Pods run on): only the boot is recorded, nothing else changes.
    Another boot: the host rebooted, which removed every partition, so each partition claim is
    marked `rebooted` (the document keeps it for its Pod: kubelet re-asks for it, or its Pod
    ends and it is released). Logical slices are no partitions and survive; so does everything
    else in a claim, its device IDs and placement included."""
    if not boot_id:
        raise TransitionError(f"card {doc.card}: an empty boot id cannot be recorded")
    if doc.boot_id == boot_id:
        return doc
    claims = doc.claims
    if doc.boot_id:
        claims = {
            cid: c if c.kind != "partition" or c.rebooted else
            msgspec.structs.replace(c, rebooted=True)
            for cid, c in doc.claims.items()
        }
    return msgspec.structs.replace(doc, claims=claims, boot_id=boot_id)


def remake(
    doc: CardClaims, claim_id: str, start: int, size: int, now: float
) -> CardClaims:
    """rebooted creating/active -> creating at (`start`, `size`) on the same card, with no
    instance: the write-ahead record of a re-create (invariant 4), which the realisation then
    completes as any creating claim. Its device IDs, Pod and container are kept."""
    claim = _get(doc, claim_id)
    if not claim.rebooted:
        raise TransitionError(f"claim {claim_id} is not rebooted; only a rebooted claim is "
                              "re-made")
    if claim.state not in ("creating", "active"):
        raise TransitionError(f"claim {claim_id} is {claim.state}; it is not re-made")
    again = msgspec.structs.replace(
        claim, state="creating", start=start, size=size, instance=None, rebooted=False,
        remakes=claim.remakes + 1, updated_at=now)
    _refuse_overlap(doc, again)
    return _with(doc, again)


def empty(node: str, card: int) -> CardClaims:
    return CardClaims(node=node, card=card, claims={})
