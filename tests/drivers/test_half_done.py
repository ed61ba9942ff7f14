"""The two half-done operations the nvml driver leaves, as regressions over the C library.

- A destroy that removed the compute instance and then failed (or died) before the GPU instance:
  the claim must still own what is left, so the reclaimer finishes the destroy and the slot comes
  back, instead of counting the claim vanished and the GPU instance foreign forever.
- A create that died between the GPU instance and its compute instance: a resumed Allocate must
  not adopt an instance without UUID (its descriptor could never be written); it completes it.
"""

from __future__ import annotations

import time

import pytest
from fakes import nvml as nv
from fakes.nvml import FakeNvml

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore, inventory, machine
from partkeeper.config import Config
from partkeeper.drivers.base import InstanceSpec, UnknownError
from partkeeper.drivers.nvml import NvmlDriver
from schemas import LiveInstance
from services.allocator import partitions
from services.allocator.context import Context
from services.reclaimer.decide import Step, decide, sighting
from tests_support import make_claim

H100 = 0


def _claim(state: str, start: int, size: int, profile: str, instance=None):
    claim = make_claim("c1", start, size, card=H100, state=state)
    return machine.msgspec.structs.replace(claim, profile=profile, instance=instance)


def test_a_half_done_destroy_is_finished_and_the_slot_comes_back(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    inst = driver.create(InstanceSpec(H100, "3g.40gb", 4))
    live = LiveInstance(gi_id=inst.gi_id, ci_id=inst.ci_id, uuid=inst.uuid)
    claim = _claim("releasing", 4, 4, "3g.40gb", live)
    doc = machine.empty("n", H100)
    doc = machine.msgspec.structs.replace(doc, claims={claim.id: claim})

    no_complaints.fail("nvmlGpuInstanceDestroy", nv.ERROR_UNKNOWN)
    with pytest.raises(UnknownError):
        driver.destroy(inst)
    [left] = driver.instances(H100)
    assert (left.gi_id, left.ci_id, left.uuid) == (inst.gi_id, -1, "")  # CI gone, GI stays

    inv = inventory.classify(doc, [left], driver.same_partition)
    assert inv.owned == {claim.id: left} and inv.vanished == [] and inv.foreign == []
    seen = sighting(doc, claim.id, [left], driver.same_partition)
    step = decide(claim, seen, "gone", time.time(), create_timeout=30)
    assert step.step is Step.DESTROY and step.instance == left
    driver.destroy(step.instance)
    assert driver.instances(H100) == []
    seen = sighting(doc, claim.id, [], driver.same_partition)
    step = decide(claim, seen, "gone", time.time(), create_timeout=30)
    assert step.step is Step.REMOVE  # only now is the claim removed
    assert driver.create(InstanceSpec(H100, "3g.40gb", 4)).gi_id == inst.gi_id  # the slot is back


def test_a_remnant_of_another_gpu_instance_is_not_taken_for_the_claim(
    no_complaints: FakeNvml,
) -> None:
    driver = NvmlDriver()
    mine = driver.create(InstanceSpec(H100, "1g.10gb", 0))
    other = driver.create(InstanceSpec(H100, "1g.10gb", 1))
    no_complaints.fail("nvmlGpuInstanceDestroy", nv.ERROR_UNKNOWN)
    with pytest.raises(UnknownError):
        driver.destroy(other)
    live = LiveInstance(gi_id=mine.gi_id, ci_id=mine.ci_id, uuid=mine.uuid)
    claim = _claim("active", 0, 1, "1g.10gb", live)
    doc = machine.msgspec.structs.replace(machine.empty("n", H100), claims={claim.id: claim})
    listed = driver.instances(H100)
    inv = inventory.classify(doc, listed, driver.same_partition)
    assert inv.owned == {claim.id: mine}
    assert [(f.gi_id, f.uuid) for f in inv.foreign] == [(other.gi_id, "")]


async def test_a_resumed_allocate_completes_a_gpu_instance_left_without_compute_instance(
    no_complaints: FakeNvml, js, node: str
) -> None:
    driver = NvmlDriver()
    no_complaints.fail("nvmlGpuInstanceCreateComputeInstance", nv.ERROR_UNKNOWN)
    no_complaints.fail("nvmlGpuInstanceDestroy", nv.ERROR_UNKNOWN)  # the undo dies too
    with pytest.raises(UnknownError):
        driver.create(InstanceSpec(H100, "2g.20gb", 2))
    [left] = driver.instances(H100)
    assert not left.complete

    store = ClaimsStore(await Bucket.open(js, "pk-claims"), node)
    claim = _claim("creating", 2, 2, "2g.20gb")
    await store.update(H100, lambda d: machine.begin(d, claim))
    ctx = Context(Config(node=node, driver="nvml"), js._nc, js, store, driver,  # type: ignore[arg-type]  # js._nc: the context's client
                  tuple(driver.cards()), {}, None, None, None)  # type: ignore[arg-type]  # parts unused here
    assert await partitions.adopt(ctx, claim) is None  # no UUID: not adopted as it is
    [active] = await partitions.realise(ctx, [claim], resume=True)
    assert active.state == "active" and active.instance is not None
    assert active.instance.gi_id == left.gi_id and active.instance.uuid.startswith("MIG-")
    assert [i.uuid for i in driver.instances(H100)] == [active.instance.uuid]
