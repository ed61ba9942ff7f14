"""The reclaimer after a host reboot (docs/reclaimer.md, "After a reboot"): a claim whose partition
the reboot removed is kept for a live Pod, released for a dead one, and removed without a
destroy; never a destroy of what sits at its slot now, whatever the card lists."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from partkeeper.drivers.base import Instance, slot_identity
from schemas import CardClaims, Claim
from schemas.events import ClaimState
from services.reclaimer.decide import PodVerdict, Sighting, Step, decide, needs_sighting, sighting
from tests_support.reclaimer_decisions import MINE, NOW, TIMEOUT, claim, instances, verdicts


def rebooted(state: ClaimState, *, recorded: bool = True, age: float = 600.0) -> Claim:
    return msgspec.structs.replace(claim(state, recorded=recorded, age=age), rebooted=True)


TABLE = [
    ("active, Pod live", rebooted("active"), "live", Step.KEEP),
    ("active, watcher silent", rebooted("active"), "no-answer", Step.KEEP),
    ("active, Pod unknown", rebooted("active"), "unknown", Step.KEEP),
    ("active, Pod gone", rebooted("active"), "gone", Step.RELEASE),
    ("active, Pod finished", rebooted("active"), "finished", Step.RELEASE),
    ("creating, Pod live", rebooted("creating", recorded=False), "live", Step.KEEP),
    ("creating, Pod gone", rebooted("creating", recorded=False), "gone", Step.RELEASE),
    ("releasing", rebooted("releasing"), "gone", Step.REMOVE),
    # Released at once after the reboot: no create of the old boot can still be under way.
    ("releasing, young, never activated", rebooted("releasing", recorded=False, age=1),
     "gone", Step.REMOVE),
]


@pytest.mark.parametrize(("c", "pod", "step"), [r[1:] for r in TABLE], ids=[r[0] for r in TABLE])
def test_after_a_reboot(c: Claim, pod: PodVerdict, step: Step) -> None:
    # Whatever the card shows: the instance the claim recorded is the old boot's.
    for seen in (Sighting(listed=True, present=MINE), Sighting(listed=True),
                 Sighting(listed=False)):
        assert decide(c, seen, pod, NOW, create_timeout=TIMEOUT).step is step
    assert not needs_sighting(c, pod)


@given(st.sampled_from(["creating", "active", "releasing"]), st.booleans(), verdicts,
       st.lists(instances, max_size=4))
def test_a_rebooted_claim_is_never_destroyed_nor_released_under_a_live_pod(
    state: ClaimState, recorded: bool, pod: PodVerdict, listed: list[Instance]
) -> None:
    c = rebooted(state, recorded=recorded)
    doc_ = CardClaims(node="n", card=0, claims={c.id: c})
    seen = sighting(doc_, c.id, listed, slot_identity)
    assert seen.present is None  # nothing on the card is its partition any more
    step = decide(c, seen, pod, NOW, create_timeout=TIMEOUT).step
    assert step is not Step.DESTROY
    if pod in ("live", "unknown", "no-answer") and state != "releasing":
        assert step is Step.KEEP
