"""What to do with a claim, as a table and as properties: the pure heart of the reclaimer."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from partkeeper.drivers.base import IdentityRule, issued_identity, slot_identity
from partkeeper.podstate import is_dead
from schemas import CardClaims, Claim
from services.reclaimer.decide import PodVerdict, Sighting, Step, decide, sighting
from tests_support.reclaimer_decisions import (
    MINE,
    NOW,
    TIMEOUT,
    claim,
    claims,
    instances,
    verdicts,
)

PRESENT = Sighting(listed=True, present=MINE)
ABSENT = Sighting(listed=True, present=None)
UNLISTED = Sighting(listed=False)

TABLE = [
    # claim, sighting, pod -> step
    ("creating, Pod live", claim("creating", recorded=False), ABSENT, "live", Step.KEEP),
    ("creating, Pod unknown", claim("creating", recorded=False), ABSENT, "unknown", Step.KEEP),
    ("creating, watcher silent", claim("creating", recorded=False), PRESENT, "no-answer",
     Step.KEEP),
    ("creating, Pod gone", claim("creating", recorded=False), ABSENT, "gone", Step.RELEASE),
    ("creating, Pod finished", claim("creating", recorded=False), PRESENT, "finished",
     Step.RELEASE),
    ("active, Pod live", claim("active"), PRESENT, "live", Step.KEEP),
    ("active, Pod unknown", claim("active"), PRESENT, "unknown", Step.KEEP),
    ("active, watcher silent", claim("active"), PRESENT, "no-answer", Step.KEEP),
    ("active, live, unreadable card", claim("active"), UNLISTED, "live", Step.KEEP),
    ("active, live, instance vanished", claim("active"), ABSENT, "live", Step.RELEASE),
    ("active, silent, instance vanished", claim("active"), ABSENT, "no-answer", Step.RELEASE),
    ("active, Pod gone", claim("active"), PRESENT, "gone", Step.RELEASE),
    ("active, Pod finished, unreadable card", claim("active"), UNLISTED, "finished",
     Step.RELEASE),
    ("releasing, instance there", claim("releasing"), PRESENT, "no-answer", Step.DESTROY),
    ("releasing, instance there, Pod live", claim("releasing"), PRESENT, "live", Step.DESTROY),
    ("releasing, instance absent", claim("releasing"), ABSENT, "gone", Step.REMOVE),
    ("releasing, unreadable card", claim("releasing"), UNLISTED, "gone", Step.WAIT),
    ("releasing mid-create, young, created", claim("releasing", recorded=False, age=5),
     PRESENT, "gone", Step.WAIT),
    ("releasing mid-create, young, not yet", claim("releasing", recorded=False, age=5),
     ABSENT, "gone", Step.WAIT),
    ("releasing, never activated, old, left behind", claim("releasing", recorded=False),
     PRESENT, "gone", Step.DESTROY),
    ("releasing, never activated, old, none", claim("releasing", recorded=False), ABSENT,
     "gone", Step.REMOVE),
    ("releasing, never activated, old, unreadable", claim("releasing", recorded=False),
     UNLISTED, "gone", Step.WAIT),
    ("slice active, Pod gone", claim("active", kind="slice"), UNLISTED, "gone", Step.RELEASE),
    ("slice active, Pod live", claim("active", kind="slice"), ABSENT, "live", Step.KEEP),
    ("slice releasing", claim("releasing", kind="slice"), UNLISTED, "live", Step.REMOVE),
    ("stored as removed", claim("removed"), PRESENT, "gone", Step.REFUSE),
    # Deliberately a state no version writes (a corrupt or future document): refused.
    ("unknown state", claim("exploded"), PRESENT, "gone", Step.REFUSE),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("claim_", "seen", "pod", "step"), [row[1:] for row in TABLE],
                         ids=[row[0] for row in TABLE])
def test_decision_table(claim_: Claim, seen: Sighting, pod: PodVerdict, step: Step) -> None:
    chosen = decide(claim_, seen, pod, NOW, create_timeout=TIMEOUT)
    assert chosen.step is step, chosen.why
    assert chosen.why
    if step is Step.DESTROY:
        assert chosen.instance == seen.present
    if step is Step.WAIT and claim_.instance is None and claim_.state == "releasing":
        assert 0 < chosen.wait <= TIMEOUT or not seen.listed




@given(c=claims, listing=st.none() | st.lists(instances, max_size=4), pod=verdicts,
       same=st.sampled_from([slot_identity, issued_identity]))
def test_decisions_never_destroy_what_they_should_not(
    c: Claim, listing, pod: PodVerdict, same: IdentityRule
) -> None:
    doc = CardClaims(node="n", card=0, claims={c.id: c})
    seen = sighting(doc, c.id, listing, same)
    chosen = decide(c, seen, pod, NOW, create_timeout=TIMEOUT)
    assert chosen == decide(c, seen, pod, NOW, create_timeout=TIMEOUT)
    if c.state not in ("creating", "active", "releasing"):
        assert chosen.step is Step.REFUSE
        return
    if chosen.step is Step.DESTROY:
        # Only a released claim, only on a successful enumeration, only its own instance.
        assert c.state == "releasing" and listing is not None
        assert chosen.instance is not None and chosen.instance in listing
        if c.instance is not None:  # every vendor's rule: a complete instance by its UUID
            assert chosen.instance.uuid == c.instance.uuid
        else:
            assert (chosen.instance.profile, chosen.instance.start) == (c.profile, c.start)
            assert NOW - c.created_at >= TIMEOUT
    if chosen.step is Step.REMOVE and c.kind == "partition":
        assert c.state == "releasing" and listing is not None and seen.present is None
    if c.state != "releasing" and not is_dead(pod):
        # A Pod not confirmed dead: its claim stands unless its instance is provably gone.
        assert chosen.step in (Step.KEEP, Step.RELEASE)
        if chosen.step is Step.RELEASE:
            assert listing is not None and seen.present is None and c.instance is not None
    if listing is None:
        assert chosen.step not in (Step.DESTROY,) and (
            chosen.step is not Step.REMOVE or c.kind == "slice")


@given(c=claims, pod=verdicts)
def test_a_claim_is_released_only_towards_removal(c: Claim, pod: PodVerdict) -> None:
    """Releasing is where every path ends up, and nothing but RELEASE leaves creating/active."""
    released = msgspec.structs.replace(c, state="releasing")
    for seen in (PRESENT, ABSENT, UNLISTED):
        first = decide(c, seen, pod, NOW, create_timeout=TIMEOUT)
        if c.state in ("creating", "active"):
            assert first.step in (Step.KEEP, Step.RELEASE)
        after = decide(released, seen, pod, NOW, create_timeout=TIMEOUT)
        if c.state in ("creating", "active", "releasing"):
            assert after.step in (Step.WAIT, Step.DESTROY, Step.REMOVE)


LOST = Sighting(listed=False, lost=True)


def _tried(c: Claim, attempts: int) -> Claim:
    return msgspec.structs.replace(c, release_attempts=attempts)


@pytest.mark.parametrize(
    ("name", "claim_", "pod", "step"),
    [
        ("releasing on a lost card, first try", claim("releasing"), "gone", Step.LOST),
        ("releasing, bound nearly reached", _tried(claim("releasing"), 3), "gone", Step.LOST),
        ("releasing, bound reached", _tried(claim("releasing"), 4), "gone", Step.ABANDON),
        ("releasing past the bound (a lower bound since)", _tried(claim("releasing"), 9),
         "finished", Step.ABANDON),
        ("active, Pod live, card lost", _tried(claim("active"), 9), "live", Step.KEEP),
        ("active, Pod unknown, card lost", claim("active"), "unknown", Step.KEEP),
        ("active, Pod gone, card lost", claim("active"), "gone", Step.RELEASE),
        ("releasing mid-create, young, card lost", claim("releasing", recorded=False, age=5),
         "gone", Step.WAIT),
        ("releasing slice, card lost", claim("releasing", kind="slice"), "gone", Step.REMOVE),
    ],
)
def test_a_lost_card(name: str, claim_: Claim, pod: PodVerdict, step: Step) -> None:
    chosen = decide(claim_, LOST, pod, NOW, create_timeout=TIMEOUT, lost_bound=5)
    assert chosen.step is step, (name, chosen.why)


@given(c=claims, pod=verdicts, attempts=st.integers(0, 12), bound=st.integers(1, 8))
def test_a_lost_card_never_abandons_a_claim_it_should_not(
    c: Claim, pod: PodVerdict, attempts: int, bound: int
) -> None:
    c = _tried(c, attempts)
    chosen = decide(c, LOST, pod, NOW, create_timeout=TIMEOUT, lost_bound=bound)
    if chosen.step is Step.ABANDON:
        # Only a released partition claim, only once its bound of attempts is used up.
        assert c.state == "releasing" and c.kind == "partition"
        assert attempts + 1 >= bound
    if chosen.step is Step.LOST:
        assert c.state == "releasing" and attempts + 1 < bound
    # A health fault never ends a claim of a Pod not confirmed dead.
    if c.state in ("creating", "active") and not is_dead(pod):
        assert chosen.step is Step.KEEP
