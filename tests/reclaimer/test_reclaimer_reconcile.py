"""The reconcile pass: claims against the hardware against the watcher's view, failing closed.

A live Pod's claim doubles as a pass counter: every pass asks the watcher about it once, so
"three more passes happened" is a condition to wait for, not a sleep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil

import pytest
from prometheus_client import REGISTRY

from schemas import ClaimChanged, ForeignFound, ForeignGone
from tests_support import until
from tests_support.reclaimer import FAST, AuditLog, FakeWatcher, Hands, new_uid


async def passes(watcher: FakeWatcher, uid: str, more: int) -> None:
    target = watcher.asked[uid] + more
    await until(lambda: watcher.asked[uid] >= target, f"{more} more reconcile passes")


async def test_a_live_pod_whose_working_directory_was_wiped_keeps_its_partition(
    hands: Hands, watcher: FakeWatcher, audit: AuditLog, start_reclaimer
) -> None:
    uid = new_uid()
    watcher.states[uid] = "live"
    claim, inst = await hands.allocate(uid)
    shutil.rmtree(hands.pods_dir / uid)  # the defect's trigger: the ownership record is gone
    await start_reclaimer()
    seq = await hands.seen(uid)
    await passes(watcher, uid, 3)
    await until(lambda: hands.acked(seq), "the PodSeen event is acknowledged")
    current = await hands.claim(claim)
    assert current is not None and current.state == "active"
    assert await hands.exists(inst)
    assert audit.of(ClaimChanged, claim_id=claim.id) == []


@pytest.mark.parametrize("mode", ["table", "error", "silent"])
async def test_unknown_or_unanswered_pods_keep_their_partitions(
    hands: Hands, watcher: FakeWatcher, nc, audit: AuditLog, start_reclaimer, mode: str
) -> None:
    uid = new_uid()  # not in the table: "unknown"; or an error answer; or no answer at all
    claim, inst = await hands.allocate(uid)
    await watcher.start(nc, hands.node, mode)
    await start_reclaimer(tuning=dataclasses.replace(FAST, watcher_timeout=0.2))
    await passes(watcher, uid, 3)
    assert (await hands.current(claim)).state == "active" and await hands.exists(inst)
    assert audit.of(ClaimChanged, claim_id=claim.id) == []


async def test_a_claim_of_a_pod_confirmed_gone_is_released_without_any_event(
    hands: Hands, watcher: FakeWatcher, audit: AuditLog, start_reclaimer
) -> None:
    uid = new_uid()
    watcher.states[uid] = "gone"
    claim, inst = await hands.allocate(uid)
    await start_reclaimer()
    await until(lambda: hands.removed(claim), "the claim is removed")
    assert not await hands.exists(inst) and not hands.descriptor(claim, inst).exists()
    [released] = await audit.wait(ClaimChanged, claim_id=claim.id, state="releasing")
    assert "pods.get" in released.reason and "gone" in released.reason


async def test_a_claim_whose_instance_vanished_is_removed_and_reported(
    hands: Hands, watcher: FakeWatcher, audit: AuditLog, start_reclaimer
) -> None:
    uid = new_uid()
    watcher.states[uid] = "live"
    claim, inst = await hands.allocate(uid)
    await asyncio.to_thread(hands.driver.destroy, inst)  # by hand, behind everyone's back
    await start_reclaimer()
    await until(lambda: hands.removed(claim), "the claim is removed")
    [released] = await audit.wait(ClaimChanged, claim_id=claim.id, state="releasing")
    assert "vanished" in released.reason
    await audit.wait(ClaimChanged, claim_id=claim.id, state="removed")


async def test_a_foreign_instance_is_reported_once_counted_and_kept(
    hands: Hands, watcher: FakeWatcher, audit: AuditLog, start_reclaimer
) -> None:
    counter = new_uid()
    watcher.states[counter] = "live"
    await hands.allocate(counter, card=1)
    carved = await asyncio.to_thread(hands.driver.carve, 0, "1g.10gb", 4)
    await start_reclaimer(foreign_grace_seconds=0.0)  # policy keep: the grace is irrelevant
    await audit.wait(ForeignFound, instance_uuid=carved.uuid)
    await passes(watcher, counter, 3)
    assert len(audit.of(ForeignFound, instance_uuid=carved.uuid)) == 1
    assert await hands.exists(carved)
    assert REGISTRY.get_sample_value("partkeeper_foreign_instances") == 1
    await asyncio.to_thread(hands.driver.destroy, carved)  # the operator removes it
    [gone] = await audit.wait(ForeignGone, instance_uuid=carved.uuid)
    assert not gone.reaped


async def test_reap_destroys_only_idle_foreign_instances_after_the_grace(
    hands: Hands, watcher: FakeWatcher, audit: AuditLog, start_reclaimer
) -> None:
    counter = new_uid()
    watcher.states[counter] = "live"
    await hands.allocate(counter, card=1)
    idle = await asyncio.to_thread(hands.driver.carve, 0, "1g.10gb", 0)
    busy = await asyncio.to_thread(hands.driver.carve, 0, "1g.10gb", 2)
    await asyncio.to_thread(hands.driver.set_busy, busy.uuid, True)
    await start_reclaimer(foreign_policy="reap", foreign_grace_seconds=0.5)
    [gone] = await audit.wait(ForeignGone, instance_uuid=idle.uuid)
    assert gone.reaped and not await hands.exists(idle)
    found = audit.of(ForeignFound, instance_uuid=idle.uuid)[0]
    assert gone.at - found.at >= 0.5  # not before its grace period
    await passes(watcher, counter, 3)
    assert await hands.exists(busy)
    assert audit.of(ForeignGone, instance_uuid=busy.uuid) == []


async def test_a_pass_with_a_failing_driver_list_destroys_nothing(
    hands: Hands, watcher: FakeWatcher, audit: AuditLog, start_reclaimer
) -> None:
    dead, live = new_uid(), new_uid()
    watcher.states.update({dead: "gone", live: "live"})
    doomed, doomed_inst = await hands.allocate(dead, card=0, start=0)
    kept, kept_inst = await hands.allocate(live, card=1, start=0)
    orphan = await asyncio.to_thread(hands.driver.carve, 0, "1g.10gb", 4)
    await asyncio.to_thread(hands.driver.fail, "list", 6)
    await start_reclaimer(foreign_policy="reap", foreign_grace_seconds=0.0)

    def failures_left() -> int:
        fault = hands.driver.list()["faults"].get("list")
        return int(fault["times"]) if fault else 0

    await until(lambda: failures_left() <= 3, "three passes met a failing enumeration")
    # Every pass so far started while enumerations failed; none may have changed anything.
    assert (await hands.current(doomed)).state == "active"
    assert (await hands.current(kept)).state == "active"
    assert audit.events == [] and watcher.asked[dead] == 0
    listed = hands.driver.list()["cards"][0]["instances"]  # a look that consumes no fault
    assert {i["uuid"] for i in listed} == {doomed_inst.uuid, orphan.uuid}
    # Once the driver reads again, the same passes act: the test would catch a fail-open pass.
    await until(lambda: hands.removed(doomed), "the gone Pod's claim is reclaimed")
    await audit.wait(ForeignGone, instance_uuid=orphan.uuid)
    assert await hands.exists(kept_inst)
