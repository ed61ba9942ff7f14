"""Every fault point (docs/contract.md section 8), end to end: the service exits there with status
86, starts again without the fault, and the node converges (invariant 8).

The whole stack runs as processes (nats-server, simulated cluster, the four services). A Pod
admitted before the fault keeps running through it: its partition must survive, and the sentinel
watches for any partition destroyed under a live Pod for the whole scenario.
"""

from __future__ import annotations

import pytest

from partkeeper import faults
from schemas import ClaimChanged, PartitionEvent, decode
from schemas.names import STREAM_PARTITIONS, parts_filter
from tests_support import until
from tests_support.reliability import (
    CONVERGE_AFTER_CREATE_TIMEOUT,
    CONVERGE_SECONDS,
    FAULT_EXIT,
    Scene,
    scene,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

PROFILE = "1g.10gb"


async def _crash_allocate(sc: Scene, point: str) -> None:
    """The allocator ends at `point` inside the Allocate of a new Pod; kubelet fails that Pod."""
    await sc.rig.restart("allocator", faults=f"{point}=exit")
    pod = await sc.work.admit(PROFILE, "victim")
    assert await sc.rig.wait_exit("allocator") == FAULT_EXIT, sc.logs(["allocator"])
    assert "UnexpectedAdmissionError" in pod.refused, f"{pod.name}: {pod.refused!r}"
    await sc.rig.restart("allocator")


async def _finish(sc: Scene, deadline: float = CONVERGE_SECONDS) -> None:
    """The scenario's Pods deleted, the node converges; then the survivor goes too."""
    await sc.work.delete_all("victim")
    await sc.work.delete_all("after")
    await sc.check_converged(deadline)
    await sc.work.delete_all()
    await sc.check_converged()


async def test_allocator_exits_between_claim_and_activation() -> None:
    """after_claim leaves a `creating` claim, after_create one with an instance at its spec;
    claims.after_write a `creating` claim whose ClaimChanged was never published. The Pods fail
    admission, the reclaimer resolves the claims once the create timeout passed, and the audit
    log holds every claim's whole trail, each state once: the unpublished `creating` was sent
    from the claims outbox (claims/outbox.py)."""
    async with scene() as sc:
        await sc.admit("3g.40gb", "keep")
        for point in ("allocator.after_claim", "allocator.after_create", "claims.after_write"):
            await _crash_allocate(sc, point)
        await sc.admit(PROFILE, "after")
        await _finish(sc, CONVERGE_AFTER_CREATE_TIMEOUT)
        # Converged means the claims are gone; their last events follow the writes.
        audit: dict[str, list[str]] = {}

        async def whole() -> bool:
            audit.update(await _claim_audit(sc))
            return len(audit) >= 5 and all(t[-1] == "removed" for t in audit.values())

        await until(whole, "every claim's audit trail ends with removed", 30)
        for states in audit.values():  # keep, three victims, after
            assert states[0] == "creating" and len(set(states)) == len(states), audit


async def test_allocator_exits_after_activation() -> None:
    async with scene() as sc:
        await sc.admit("3g.40gb", "keep")
        await _crash_allocate(sc, "allocator.after_active")
        await sc.admit(PROFILE, "after")
        await _finish(sc)


@pytest.mark.parametrize("point", ["reclaimer.after_releasing", "reclaimer.after_destroy"])
async def test_reclaimer_exits_mid_reclaim(point: str) -> None:
    async with scene() as sc:
        await sc.admit("3g.40gb", "keep")
        victim = await sc.admit(PROFILE, "victim")
        await sc.rig.restart("reclaimer", faults=f"{point}=exit")
        await sc.work.delete(victim)
        assert await sc.rig.wait_exit("reclaimer") == FAULT_EXIT, sc.logs(["reclaimer"])
        await sc.rig.restart("reclaimer")
        await sc.admit(PROFILE, "after")
        await _finish(sc)


async def test_gc_exits_before_delete() -> None:
    """A logical slice's working directory: the GC ends before deleting it, then deletes it."""
    async with scene() as sc:
        await sc.admit("3g.40gb", "keep")
        victim = await sc.admit(None, "victim")
        await sc.rig.restart("gc", faults="gc.before_delete=exit")
        await sc.work.delete(victim)
        assert await sc.rig.wait_exit("gc") == FAULT_EXIT, sc.logs(["gc"])
        assert (sc.rig.layout.pods_dir / victim.uid).exists(), "deleted before the fault point"
        await sc.rig.restart("gc")
        await sc.admit(None, "after")
        await _finish(sc)


async def test_watcher_exits_before_publish() -> None:
    """The watcher ends before announcing a deleted Pod; the new one announces it from its
    persisted view and a fresh LIST."""
    async with scene() as sc:
        await sc.admit("3g.40gb", "keep")
        victim = await sc.admit(PROFILE, "victim")
        await sc.rig.restart("watcher", faults="watcher.before_publish=exit")
        await sc.work.delete(victim)
        assert await sc.rig.wait_exit("watcher") == FAULT_EXIT, sc.logs(["watcher"])
        await sc.rig.restart("watcher")
        await sc.admit(PROFILE, "after")
        await _finish(sc)


async def _claim_audit(sc: Scene) -> dict[str, list[str]]:
    """claim id -> the states PK_PARTITIONS holds for it, in order, read to the end."""
    js = sc.rig.stack.nc.jetstream()
    last = (await js.stream_info(STREAM_PARTITIONS)).state.last_seq
    states: dict[str, list[str]] = {}
    sub = await js.subscribe(parts_filter(sc.rig.stack.node), ordered_consumer=True)
    try:
        while last:
            msg = await sub.next_msg(timeout=10)
            event = decode(msg.data, PartitionEvent)
            if isinstance(event, ClaimChanged):
                states.setdefault(event.claim_id, []).append(event.state)
            if msg.metadata.sequence.stream >= last:
                break
    finally:
        await sub.unsubscribe()
    return states


def test_every_fault_point_has_a_scenario() -> None:
    covered = {
        "allocator.after_claim", "allocator.after_create", "allocator.after_active",
        "reclaimer.after_releasing", "reclaimer.after_destroy", "gc.before_delete",
        "watcher.before_publish", "claims.after_write",
    }
    assert covered == faults.POINTS
