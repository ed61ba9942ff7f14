"""A card that stops answering, against a real nats-server and the sim driver: the claims of
ended Pods on it are removed within the bounded retry, with the reason, and never retried for
ever; live Pods keep their claims; the other cards are reclaimed as usual."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from schemas import ClaimChanged, DestroyFailed
from tests_support import until
from tests_support.reclaimer import FAST, AuditLog, FakeWatcher, Hands, new_uid

LOST_XID = 79


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_gone_pods_claim_on_a_lost_card_is_removed_within_the_bound(
    hands: Hands, audit: AuditLog, watcher: FakeWatcher, start_reclaimer
) -> None:
    gone_uid, live_uid, other_uid = new_uid(), new_uid(), new_uid()
    gone, gone_inst = await hands.allocate(gone_uid, card=0, start=2)
    live, _ = await hands.allocate(live_uid, card=0, start=4)
    other, other_inst = await hands.allocate(other_uid, card=1, start=0)
    watcher.states.update({gone_uid: "gone", live_uid: "live", other_uid: "gone"})
    lost_before = _sample("partkeeper_destroy_failures_total", reason="card_lost")
    await asyncio.to_thread(hands.driver.fail_card, 0, LOST_XID)
    await start_reclaimer()

    seq = await hands.gone(gone_uid)
    await until(lambda: hands.acked(seq), "the PodGone event is acknowledged")
    assert await hands.claim(gone) is None
    [removed] = await audit.wait(ClaimChanged, claim_id=gone.id, state="removed")
    assert "card is lost" in removed.reason and "abandoned" in removed.reason
    [told] = await audit.wait(DestroyFailed, claim_id=gone.id)
    assert told.reason == "card_lost" and told.instance_uuid == gone_inst.uuid
    assert told.attempts == FAST.destroy_threshold  # the bound, not for ever
    assert _sample("partkeeper_destroy_failures_total", reason="card_lost") == (
        lost_before + FAST.destroy_threshold)
    assert not hands.descriptor(gone, gone_inst).exists()

    # The other card is reclaimed as usual meanwhile.
    other_seq = await hands.gone(other_uid)
    await until(lambda: hands.acked(other_seq), "the other card's Pod is reclaimed")
    assert await hands.claim(other) is None and not await hands.exists(other_inst)

    # The running Pod's claim on the lost card stands, whatever the reconcile passes see.
    held = await hands.claim(live)
    assert held is not None and held.state == "active"


async def test_a_failed_card_that_still_answers_is_reclaimed_as_usual(
    hands: Hands, audit: AuditLog, watcher: FakeWatcher, start_reclaimer
) -> None:
    """A fatal XID stops placements, not destroys: the ended Pod's partition is destroyed."""
    uid = new_uid()
    claim, inst = await hands.allocate(uid, card=1, start=0)
    watcher.states[uid] = "gone"
    await asyncio.to_thread(hands.driver.fail_card, 1, 48)
    await start_reclaimer()
    seq = await hands.gone(uid)
    await until(lambda: hands.acked(seq), "the event is acknowledged once destroyed")
    assert await hands.claim(claim) is None and not await hands.exists(inst)
    assert audit.of(DestroyFailed, claim_id=claim.id) == []  # a failed card still destroys
