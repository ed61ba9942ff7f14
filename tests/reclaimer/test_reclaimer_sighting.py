"""`needs_sighting`: the reclaimer skips the card's enumeration only where `decide` would not
look at it, so skipping it (issue 27: no driver call before the common first step, the release
of a dead Pod's claim) never changes a decision."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from partkeeper.drivers.base import IdentityRule, Instance, issued_identity, slot_identity
from schemas import CardClaims, Claim
from services.reclaimer.decide import PodVerdict, Sighting, Step, decide, needs_sighting, sighting
from tests_support.reclaimer_decisions import NOW, claim, claims, instances, verdicts


@given(c=claims, listing=st.none() | st.lists(instances, max_size=4), pod=verdicts,
       same=st.sampled_from([slot_identity, issued_identity]))
def test_an_unneeded_sighting_changes_no_decision(
    c: Claim, listing: list[Instance] | None, pod: PodVerdict, same: IdentityRule
) -> None:
    if needs_sighting(c, pod):
        return
    doc = CardClaims(node="n", card=0, claims={c.id: c})
    seen = sighting(doc, c.id, listing, same)
    with_cards = decide(c, seen, pod, NOW, create_timeout=60.0)
    without = decide(c, Sighting(listed=False), pod, NOW, create_timeout=60.0)
    assert with_cards == without


def test_a_dead_pods_active_claim_is_released_without_the_cards() -> None:
    active = claim("active")
    assert not needs_sighting(active, "gone") and not needs_sighting(active, "finished")
    assert decide(active, Sighting(listed=False), "gone", NOW,
                  create_timeout=60.0).step is Step.RELEASE
    assert needs_sighting(claim("releasing"), "gone") and needs_sighting(active, "live")
