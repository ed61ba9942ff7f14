"""`reclaim.now`: destroys at once only what the watcher freshly confirms dead; refuses the rest."""

from __future__ import annotations

import msgspec

from partkeeper.bus import request
from partkeeper.claims import machine
from schemas import ClaimChanged, ReclaimNow, ReclaimNowReply
from schemas.names import reclaim_now_subject
from tests_support import until
from tests_support.reclaimer import AuditLog, FakeWatcher, Hands, new_uid


async def ask(nc, node: str, *claim_ids: str) -> dict[str, tuple[bool, str]]:
    reply = await request(nc, reclaim_now_subject(node), ReclaimNow(claim_ids=list(claim_ids)),
                          ReclaimNowReply, timeout=10)
    return {o.claim_id: (o.done, o.reason) for o in reply.outcomes}


async def start_alone(hands: Hands, watcher: FakeWatcher, start_reclaimer) -> None:
    """A reclaimer whose only reconcile pass is the start-up one, and that one already done.

    The start-up pass runs concurrently with the test; waiting until it has asked about a live
    Pod means it has read the claims, so it cannot act on any claim the test writes afterwards.
    """
    marker = new_uid()
    watcher.states[marker] = "live"
    await hands.allocate(marker, card=1, start=6)
    await start_reclaimer(resync_seconds=3600)
    await until(lambda: watcher.asked[marker] >= 1, "the start-up pass has read the claims")


async def test_destroys_confirmed_dead_and_refuses_everything_else(
    hands: Hands, watcher: FakeWatcher, nc, start_reclaimer
) -> None:
    await start_alone(hands, watcher, start_reclaimer)
    gone, finished, live, unknown, creating = (new_uid() for _ in range(5))
    watcher.states.update({gone: "gone", finished: "finished", live: "live", creating: "gone"})
    c_gone, i_gone = await hands.allocate(gone, card=0, start=0)
    c_fin, i_fin = await hands.allocate(finished, card=0, start=2)
    c_live, i_live = await hands.allocate(live, card=1, start=0)
    c_unk, i_unk = await hands.allocate(unknown, card=1, start=2)
    c_new = await hands.begin(creating, card=1, start=4)
    outcomes = await ask(nc, hands.node, c_gone.id, c_fin.id, c_live.id, c_unk.id, c_new.id,
                         "no-such-claim")
    assert outcomes[c_gone.id][0] and outcomes[c_fin.id][0]
    assert not await hands.exists(i_gone) and not await hands.exists(i_fin)
    assert await hands.removed(c_gone) and await hands.removed(c_fin)
    refused = {cid: why for cid, (done, why) in outcomes.items() if not done}
    assert set(refused) == {c_live.id, c_unk.id, c_new.id, "no-such-claim"}
    assert "live" in refused[c_live.id] and "unknown" in refused[c_unk.id]
    assert "creating" in refused[c_new.id] and "not on this node" in refused["no-such-claim"]
    assert await hands.exists(i_live) and await hands.exists(i_unk)
    assert (await hands.current(c_live)).state == "active"
    assert set(watcher.fresh) == {gone, finished, live, unknown, creating}  # asked afresh


async def test_a_later_event_for_the_pod_finds_nothing_left_to_do(
    hands: Hands, watcher: FakeWatcher, audit: AuditLog, nc, start_reclaimer
) -> None:
    await start_alone(hands, watcher, start_reclaimer)
    uid = new_uid()
    watcher.states[uid] = "gone"
    claim, inst = await hands.allocate(uid)
    assert (await ask(nc, hands.node, claim.id))[claim.id][0]
    assert not await hands.exists(inst)
    before = list(audit.events)
    seq = await hands.gone(uid)
    await until(lambda: hands.acked(seq), "the PodGone event is acknowledged")
    await until(lambda: len(audit.of(ClaimChanged, claim_id=claim.id)) == 2, "audit complete")
    assert [e.state for e in audit.of(ClaimChanged, claim_id=claim.id)] == [
        "releasing", "removed"]
    # Nothing else happened: no event of another claim, nor one of no claim (a foreign one).
    assert [e for e in audit.events
            if e not in before and getattr(e, "claim_id", None) != claim.id] == []


async def test_a_releasing_claim_is_accepted_and_no_answer_means_no_action(
    hands: Hands, watcher: FakeWatcher, nc, start_reclaimer
) -> None:
    await start_alone(hands, watcher, start_reclaimer)
    released_uid, silent_uid = new_uid(), new_uid()
    watcher.states.update({released_uid: "gone", silent_uid: "gone"})
    released, r_inst = await hands.allocate(released_uid, card=0)
    await hands.store.update(0, lambda d: machine.release(d, released.id, "test", 1.0))
    assert (await ask(nc, hands.node, released.id))[released.id][0]
    assert not await hands.exists(r_inst)
    silent, s_inst = await hands.allocate(silent_uid, card=1)
    await watcher.stop()
    done, why = (await ask(nc, hands.node, silent.id))[silent.id]
    assert not done and "did not answer" in why
    assert await hands.exists(s_inst) and (await hands.current(silent)).state == "active"


async def test_a_dra_claim_is_destroyed_only_once_released_never_on_its_first_pods_end(
    hands: Hands, watcher: FakeWatcher, nc, start_reclaimer
) -> None:
    await start_alone(hands, watcher, start_reclaimer)
    first = new_uid()
    watcher.states[first] = "gone"  # the first Pod of reservedFor; another still uses the claim
    claim, inst = await hands.allocate(first, card=0, start=0)

    def shared(doc):
        dra = msgspec.structs.replace(doc.claims[claim.id], resource_claim="default/shared",
                                      resource_claim_uid="rc-1")
        return msgspec.structs.replace(doc, claims={**doc.claims, claim.id: dra})

    await hands.store.update(0, shared)
    (done, why) = (await ask(nc, hands.node, claim.id))[claim.id]
    assert not done and "ResourceClaim default/shared" in why
    assert await hands.exists(inst) and first not in watcher.fresh
    await hands.store.update(0, lambda d: machine.release(d, claim.id, "claim ended", 0.0))
    (done, _) = (await ask(nc, hands.node, claim.id))[claim.id]
    assert done and not await hands.exists(inst)
