"""What to do with one claim, as a pure function of a snapshot: the claim, what the card's
enumeration says about its instance, what is known about its Pod, and the time.

Nothing here performs I/O. The shells (`resolve.py`, `reconcile.py`) read the snapshot, call
`decide`, carry out the one step it names and decide again on a fresh snapshot, so every step is
taken on evidence read after the previous step was durable.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from partkeeper.claims import inventory
from partkeeper.drivers.base import IdentityRule, Instance
from partkeeper.podstate import is_dead
from schemas import CardClaims, Claim
from services.reclaimer.tuning import DESTROY_THRESHOLD

PodVerdict = Literal["live", "finished", "gone", "unknown", "no-answer"]
KNOWN_STATES = frozenset({"creating", "active", "releasing"})


class Step(StrEnum):
    KEEP = "keep"  # nothing to do: the claim stands
    RELEASE = "release"  # compare-and-set to releasing (durable intent, tokens go Unhealthy)
    WAIT = "wait"  # come back later: the allocator may be mid-create, or the card was unreadable
    DESTROY = "destroy"  # destroy exactly `instance` (its identity is the expected one)
    REMOVE = "remove"  # the instance is confirmed absent: drop the descriptor, then the claim
    REFUSE = "refuse"  # the claim is in a state this code does not know: touch nothing
    LOST = "lost"  # its card stopped answering: count the attempt, retry within the bound
    ABANDON = "abandon"  # its card stayed lost for the whole bound: remove the claim, nothing
    # is left to destroy (a lost card comes back only through a reset, which clears it)


@dataclass(frozen=True, slots=True)
class Sighting:
    """What one successful (or failed) enumeration of the card says about one claim."""

    listed: bool  # False: the enumeration failed, so absence means nothing (fail closed)
    present: Instance | None = None  # its recorded instance, or one exactly at its spec
    lost: bool = False  # the enumeration failed because the card is lost


@dataclass(frozen=True, slots=True)
class Decision:
    step: Step
    why: str
    instance: Instance | None = None  # DESTROY: the instance to destroy, with its identity
    wait: float = 0.0  # WAIT: at most this long before deciding again (0: the usual retry)


def sighting(
    doc: CardClaims, claim_id: str, instances: list[Instance] | None, same: IdentityRule,
    *, lost: bool = False,
) -> Sighting:
    """Match the claim to the enumeration through `inventory.classify` with the driver's identity
    rule `same` (instances None: the read failed; `lost`: because the card is lost)."""
    if instances is None:
        return Sighting(listed=False, lost=lost)
    inv = inventory.classify(doc, instances, same)
    present = inv.owned.get(claim_id) or inv.unrecorded.get(claim_id)
    return Sighting(listed=True, present=present)


def needs_sighting(claim: Claim, pod: PodVerdict) -> bool:
    """Whether `decide` looks at the card's enumeration for `claim`. A claim of a dead Pod that is
    not releasing yet is released whatever the card shows (the destroy that follows enumerates
    afresh), so the common first step of a reclaim needs no driver call."""
    if claim.rebooted and claim.state in KNOWN_STATES:
        return False  # a reboot removed its partition: nothing on the card can be it
    if claim.state == "releasing" or claim.state not in KNOWN_STATES:
        return True
    return not (is_dead(pod) and not claim.resource_claim_uid)


def decide(
    claim: Claim, seen: Sighting, pod: PodVerdict, now: float, *, create_timeout: float,
    lost_bound: int = DESTROY_THRESHOLD,
) -> Decision:
    """The next step for `claim`. See docs/reclaimer.md for the table this implements.
    `lost_bound`: how many attempts a releasing claim on a lost card gets before it is
    abandoned (the reclaimer's destroy threshold)."""
    if claim.state not in KNOWN_STATES:
        return Decision(Step.REFUSE, f"claim is in unknown state {claim.state!r}")
    if claim.state == "releasing":
        return _releasing(claim, seen, now, create_timeout, lost_bound)
    # DRA mode: the partition belongs to the ResourceClaim, which several Pods may share, and
    # `pod_uid` names only the first of them: no Pod's end releases it. The allocator does once
    # the claim is unprepared and deallocated, or deleted (services/allocator/dra/ends.py).
    if is_dead(pod) and not claim.resource_claim_uid:
        return Decision(Step.RELEASE, f"Pod is {pod}")
    if claim.rebooted:
        # Kept for its Pod: kubelet starts the container again and the allocator re-makes it.
        return Decision(Step.KEEP, f"a host reboot removed its partition; Pod is {pod}, kept "
                        "for the allocator to re-make when kubelet asks again")
    recorded = claim.kind == "partition" and claim.state == "active" and claim.instance is not None
    if recorded and seen.listed and seen.present is None:
        return Decision(Step.RELEASE, "its instance vanished from the card")
    if claim.resource_claim_uid:
        return Decision(Step.KEEP, f"ResourceClaim {claim.resource_claim} holds it; claim is "
                        f"{claim.state}")
    return Decision(Step.KEEP, f"Pod is {pod}; claim is {claim.state}")


def _releasing(
    claim: Claim, seen: Sighting, now: float, create_timeout: float, lost_bound: int
) -> Decision:
    if claim.kind != "partition":
        return Decision(Step.REMOVE, "a logical slice has no instance to destroy")
    if claim.rebooted:
        # Never a destroy: what sits at its slot now (even with the same name-based UUID) was
        # made in this boot, by someone else.
        return Decision(Step.REMOVE, "a host reboot removed its partition: nothing to destroy")
    if claim.instance is None and now - claim.created_at < create_timeout:
        # Released while the allocator may still be creating: its activation finds the claim
        # releasing and undoes its own instance; acting now would race its create.
        left = create_timeout - (now - claim.created_at)
        why = f"the allocator may still be creating it ({left:.0f}s left)"
        return Decision(Step.WAIT, why, wait=left)
    if not seen.listed and seen.lost:
        attempts = claim.release_attempts + 1
        if attempts >= lost_bound:
            return Decision(Step.ABANDON, f"its card is lost ({attempts} attempts): nothing is "
                            "left to destroy, and a reset clears the card")
        return Decision(Step.LOST, f"its card is lost (attempt {attempts} of {lost_bound})")
    if not seen.listed:
        return Decision(Step.WAIT, "the card could not be enumerated")
    if seen.present is not None:
        return Decision(Step.DESTROY, "released and its instance exists", seen.present)
    return Decision(Step.REMOVE, "released and its instance is confirmed absent")
