"""The Pod-event path against a real nats-server and the sim driver: regressions of the measured
failures (a successor destroyed by a stale event, a destroy refused in use, lost work)."""

from __future__ import annotations

import asyncio
import dataclasses

from prometheus_client import REGISTRY

from partkeeper.bus import publish
from partkeeper.claims import machine
from schemas import ClaimChanged, DestroyFailed, PodGone
from schemas.names import STREAM_DLQ, dlq_subject, pods_subject
from tests_support import until
from tests_support.reclaimer import FAST, AuditLog, FakeWatcher, Hands, new_uid


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_pod_gone_releases_destroys_and_removes_then_acks(
    hands: Hands, audit: AuditLog, start_reclaimer
) -> None:
    uid = new_uid()
    claim, inst = await hands.allocate(uid, card=0, start=2)
    other, other_inst = await hands.allocate(uid, card=1, start=0, container="side")
    before = _sample("partkeeper_reclaim_seconds_count")
    await start_reclaimer()
    seq = await hands.gone(uid)
    await until(lambda: hands.acked(seq), "the PodGone event is acknowledged")
    for c, i in ((claim, inst), (other, other_inst)):
        assert await hands.claim(c) is None
        assert not await hands.exists(i)
        assert not hands.descriptor(c, i).exists()
        await audit.wait(ClaimChanged, claim_id=c.id, state="removed")
        states = [e.state for e in audit.of(ClaimChanged, claim_id=c.id)]
        assert states == ["releasing", "removed"]
    assert not (hands.pods_dir / uid).exists()  # the empty container and Pod dirs went too
    assert _sample("partkeeper_reclaim_seconds_count") == before + 2


async def test_a_destroy_stopped_halfway_is_finished_before_the_claim_goes(
    hands: Hands, audit: AuditLog, start_reclaimer
) -> None:
    """The sim's halfway destroy removes the compute instance and fails: the claim owns the GPU
    instance left behind (the driver's identity rule), the retry destroys it, only then the claim
    and its descriptor go, and nothing is left foreign."""
    uid = new_uid()
    claim, inst = await hands.allocate(uid, card=0, start=2)
    await asyncio.to_thread(hands.driver.fail, "destroy", 1, "halfway")
    await start_reclaimer()
    seq = await hands.gone(uid)
    await until(lambda: hands.acked(seq), "the PodGone event is acknowledged once destroyed")
    assert await hands.claim(claim) is None and await hands.instances(0) == []
    assert not hands.descriptor(claim, inst).exists()
    assert hands.driver.list()["faults"]["destroy"]["times"] == 0  # the halfway one was taken
    assert audit.of(DestroyFailed, claim_id=claim.id) == []  # one failure, below the threshold


async def test_pod_finished_is_reclaimed_like_gone(hands: Hands, start_reclaimer) -> None:
    uid = new_uid()
    claim, inst = await hands.allocate(uid)
    await start_reclaimer()
    seq = await hands.finished(uid)
    await until(lambda: hands.acked(seq), "the PodFinished event is acknowledged")
    assert await hands.claim(claim) is None and not await hands.exists(inst)


async def test_successor_at_the_same_slot_survives_stale_and_duplicated_events(
    hands: Hands, audit: AuditLog, start_reclaimer
) -> None:
    old_uid, new_uid_ = new_uid(), new_uid()
    old, old_inst = await hands.allocate(old_uid, card=0, start=0)
    await start_reclaimer()
    await hands.gone(old_uid)
    await until(lambda: hands.removed(old), "the predecessor's claim is removed")
    successor, succ_inst = await hands.allocate(new_uid_, card=0, start=0)
    # The hazard is real: the successor reproduces the predecessor's whole identity.
    assert (succ_inst.uuid, succ_inst.gi_id, succ_inst.start) == (
        old_inst.uuid, old_inst.gi_id, old_inst.start)
    seqs = [
        await hands.gone(old_uid),  # a duplicate inside the window: dropped by the stream
        await hands.gone(old_uid, msg_id=f"PodGone/{old_uid}/replayed"),  # stale, after it
        await hands.finished(old_uid),  # out of order: finished after gone
        await hands.seen(old_uid),
    ]
    await until(lambda: hands.acked(max(seqs)), "the stale events are acknowledged")
    current = await hands.claim(successor)
    assert current is not None and current.state == "active"
    assert await hands.exists(succ_inst)
    assert hands.descriptor(successor, succ_inst).exists()
    assert audit.of(ClaimChanged, claim_id=successor.id) == []


async def test_events_twice_or_out_of_order_change_nothing_more(
    hands: Hands, audit: AuditLog, start_reclaimer
) -> None:
    uid, bystander = new_uid(), new_uid()
    claim, inst = await hands.allocate(uid, card=0, start=4)
    keep, keep_inst = await hands.allocate(bystander, card=0, start=6)
    await start_reclaimer()
    seqs = [
        await hands.seen(uid),
        await hands.finished(uid),
        await hands.gone(uid),
        await hands.finished(uid, msg_id=f"PodFinished/{uid}/again"),
        await hands.gone(uid, msg_id=f"PodGone/{uid}/again"),
        await hands.seen(uid),
    ]
    await until(lambda: hands.acked(max(seqs)), "every event is acknowledged")
    assert await hands.claim(claim) is None and not await hands.exists(inst)
    await audit.wait(ClaimChanged, claim_id=claim.id, state="removed")
    assert [e.state for e in audit.of(ClaimChanged, claim_id=claim.id)] == [
        "releasing", "removed"]
    assert (await hands.current(keep)).state == "active" and await hands.exists(keep_inst)


async def test_in_use_then_released_then_destroyed(
    hands: Hands, audit: AuditLog, start_reclaimer
) -> None:
    uid = new_uid()
    claim, inst = await hands.allocate(uid)
    await asyncio.to_thread(hands.driver.set_busy, inst.uuid, True)
    failures = _sample("partkeeper_destroy_failures_total", reason="in_use")
    await start_reclaimer()
    seq = await hands.gone(uid)
    [failed] = await audit.wait(DestroyFailed, claim_id=claim.id)
    assert failed.reason == "in_use" and failed.attempts == 3 and failed.pod_uid == uid
    held = await hands.claim(claim)
    assert held is not None and held.state == "releasing" and held.release_attempts >= 3
    assert await hands.exists(inst)
    assert not await hands.acked(seq)  # the event waits for the claim to be resolved
    assert _sample("partkeeper_destroy_failures_total", reason="in_use") >= failures + 3
    await asyncio.to_thread(hands.driver.set_busy, inst.uuid, False)
    await until(lambda: hands.acked(seq), "the event is acknowledged once destroyed")
    assert await hands.claim(claim) is None and not await hands.exists(inst)
    assert len(audit.of(DestroyFailed, claim_id=claim.id)) == 1


async def test_a_card_refusing_holds_up_nobody(hands: Hands, start_reclaimer) -> None:
    stuck_uid, other_uid, neighbour_uid = new_uid(), new_uid(), new_uid()
    stuck, stuck_inst = await hands.allocate(stuck_uid, card=0, start=0)
    other, other_inst = await hands.allocate(other_uid, card=1, start=0)
    neighbour, neighbour_inst = await hands.allocate(neighbour_uid, card=0, start=2)
    await asyncio.to_thread(hands.driver.set_busy, stuck_inst.uuid, True)
    await start_reclaimer()
    await hands.gone(stuck_uid)
    await hands.gone(other_uid)
    last = await hands.gone(neighbour_uid)

    async def others_done() -> bool:
        return await hands.removed(other) and await hands.removed(neighbour)

    await until(others_done, "the later Pods' claims are resolved behind the stuck one")
    assert not await hands.exists(other_inst) and not await hands.exists(neighbour_inst)
    assert (await hands.current(stuck)).state == "releasing" and await hands.exists(stuck_inst)
    await asyncio.to_thread(hands.driver.set_busy, stuck_inst.uuid, False)
    await until(lambda: hands.acked(last), "every event is acknowledged once the card gives way")
    assert await hands.removed(stuck) and not await hands.exists(stuck_inst)


async def test_a_claim_released_mid_create_is_left_to_the_allocators_rollback(
    hands: Hands, audit: AuditLog, start_reclaimer
) -> None:
    uid = new_uid()
    claim = await hands.begin(uid, start=4)
    await start_reclaimer()
    seq = await hands.gone(uid)
    await audit.wait(ClaimChanged, claim_id=claim.id, state="releasing")
    inst = await hands.create(claim)  # the allocator's create completes after the release
    assert not await hands.acked(seq)
    # The allocator's activation finds the claim releasing: it undoes its own create.
    await asyncio.to_thread(hands.driver.destroy, inst)
    await hands.store.update(claim.card, lambda d: machine.remove(d, claim.id, abandon=True))
    await until(lambda: hands.acked(seq), "the event is acknowledged after the rollback")
    assert await hands.claim(claim) is None


async def test_a_create_abandoned_by_a_crashed_allocator_is_destroyed_after_the_timeout(
    hands: Hands, start_reclaimer
) -> None:
    uid = new_uid()
    claim = await hands.begin(uid, start=6)
    inst = await hands.create(claim)  # created, never activated: the allocator died here
    await start_reclaimer(tuning=dataclasses.replace(FAST, create_timeout=0.5))
    seq = await hands.gone(uid)
    await until(lambda: hands.acked(seq), "the event is acknowledged")
    assert await hands.claim(claim) is None and not await hands.exists(inst)


async def test_malformed_events_are_dead_lettered_and_change_nothing(
    hands: Hands, js, nc, start_reclaimer, watcher: FakeWatcher
) -> None:
    uid = new_uid()
    watcher.states[uid] = "live"
    claim, inst = await hands.allocate(uid)
    await start_reclaimer()
    subject = pods_subject(hands.node, uid)
    await js.publish(subject, b"not json", headers={"Nats-Msg-Id": f"bad/{uid}/1"})
    await js.publish(subject, b'{"v": 99, "type": "PodGone", "uid": "x"}',
                     headers={"Nats-Msg-Id": f"bad/{uid}/2"})
    odd = PodGone(node=hands.node, uid="../../etc", namespace="d", name="p",
                  resource_version="1", observed_at=0, evidence="deleted")
    await publish(js, subject, odd, msg_id=f"bad/{uid}/3")
    elsewhere = PodGone(node="another-node", uid=uid, namespace="d", name="p",
                        resource_version="1", observed_at=0, evidence="deleted")
    ack = await publish(js, subject, elsewhere, msg_id=f"bad/{uid}/4")
    dlq = dlq_subject(hands.node, "reclaimer")

    async def dead_lettered() -> bool:
        info = await js.stream_info(STREAM_DLQ, subjects_filter=dlq)
        return (info.state.subjects or {}).get(dlq, 0) == 4

    await until(dead_lettered, "four messages in the dead-letter stream")
    await until(lambda: hands.acked(ack.seq), "the consumer moved past them")
    assert (await hands.current(claim)).state == "active" and await hands.exists(inst)
