"""Half-done operations and recorded identities through the claims' inventory, the reclaimer's
decision and the allocator's resume, on every harness whose fake can leave them (harness.py).

- A destroy that removed the compute instance and then failed (or died) before the GPU instance:
  the claim must still own what is left, so the reclaimer finishes the destroy and the slot comes
  back, instead of counting the claim vanished and the GPU instance foreign forever.
- A create that died between the GPU instance and its compute instance: a resumed Allocate must
  not adopt an instance without UUID (its descriptor could never be written); it completes it.
- A predecessor's claim owns its successor at the same slot exactly where the vendor reproduces
  the identity, which is why partkeeper never acts on a stale claim.
"""

from __future__ import annotations

import time

import msgspec
import pytest

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore, inventory, machine
from partkeeper.config import Config
from partkeeper.drivers.base import Instance, InstanceSpec, UnknownError
from schemas import CardClaims, Claim, LiveInstance
from schemas.events import ClaimState
from services.allocator.core import writes
from services.allocator.core.state import Context
from services.reclaimer.decide import Step, decide, sighting
from tests_support import make_claim
from tests_support.drivers import Harness


def _claim(
    spec: InstanceSpec, size: int, state: ClaimState, instance: Instance | None = None
) -> Claim:
    live = instance and LiveInstance(gi_id=instance.gi_id, ci_id=instance.ci_id, uuid=instance.uuid)
    claim = make_claim("c1", spec.start, size, card=spec.card, state=state)
    return msgspec.structs.replace(claim, profile=spec.profile, instance=live)


def _recorded(inst: Instance, state: ClaimState) -> tuple[Claim, CardClaims]:
    """A claim in `state` recording `inst`, and its card's document holding only that claim."""
    claim = _claim(inst.spec, inst.size, state, inst)
    doc = msgspec.structs.replace(machine.empty("n", inst.card), claims={claim.id: claim})
    return claim, doc


def test_a_half_done_destroy_is_finished_and_the_slot_comes_back(harness: Harness) -> None:
    driver = harness.driver
    profile, start = harness.away_from_zero
    inst = driver.create(InstanceSpec(0, profile.name, start))
    claim, doc = _recorded(inst, "releasing")

    harness.fail("gi_destroy")
    with pytest.raises(UnknownError):
        driver.destroy(inst)
    [left] = driver.instances(0)
    assert (left.gi_id, left.ci_id, left.uuid) == (inst.gi_id, -1, "")  # CI gone, GI stays

    inv = inventory.classify(doc, [left], driver.same_partition)
    assert inv.owned == {claim.id: left} and inv.vanished == [] and inv.foreign == []
    seen = sighting(doc, claim.id, [left], driver.same_partition)
    step = decide(claim, seen, "gone", time.time(), create_timeout=30)
    assert step.step is Step.DESTROY and step.instance == left
    driver.destroy(step.instance)
    assert driver.instances(0) == []
    seen = sighting(doc, claim.id, [], driver.same_partition)
    step = decide(claim, seen, "gone", time.time(), create_timeout=30)
    assert step.step is Step.REMOVE  # only now is the claim removed
    assert driver.create(InstanceSpec(0, profile.name, start)).gi_id == inst.gi_id  # slot is back


def test_a_destroy_with_the_recorded_identity_finishes_a_half_done_one(harness: Harness) -> None:
    driver = harness.driver
    profile, start = harness.away_from_zero
    inst = driver.create(InstanceSpec(0, profile.name, start))
    harness.fail("gi_destroy")
    with pytest.raises(UnknownError):
        driver.destroy(inst)
    [left] = driver.instances(0)
    assert driver.same_partition(inst, left)  # the remnant is the recorded partition
    driver.destroy(inst)
    assert driver.instances(0) == []


def test_a_remnant_of_another_gpu_instance_is_not_taken_for_the_claim(harness: Harness) -> None:
    driver = harness.driver
    small = harness.smallest
    mine = driver.create(InstanceSpec(0, small.name, small.starts[0]))
    other = driver.create(InstanceSpec(0, small.name, small.starts[1]))
    harness.fail("gi_destroy")
    with pytest.raises(UnknownError):
        driver.destroy(other)
    claim, doc = _recorded(mine, "active")
    inv = inventory.classify(doc, driver.instances(0), driver.same_partition)
    assert inv.owned == {claim.id: mine}
    assert [(f.gi_id, f.uuid) for f in inv.foreign] == [(other.gi_id, "")]


async def test_a_resumed_allocate_completes_a_gpu_instance_left_without_compute_instance(
    harness: Harness, js, node: str
) -> None:
    driver = harness.driver
    profile, start = harness.away_from_zero
    spec = InstanceSpec(0, profile.name, start)
    harness.fail("ci_create")
    harness.fail("gi_destroy")  # the undo dies too
    with pytest.raises(UnknownError):
        driver.create(spec)
    [left] = driver.instances(0)
    assert not left.complete

    store = ClaimsStore(await Bucket.open(js, "pk-claims"), node)
    claim = _claim(spec, profile.size, "creating")
    await store.update(0, lambda d: machine.begin(d, claim))
    config = Config(node=node, driver=driver.name)  # type: ignore[arg-type]  # a driver's name is one of Config's
    ctx = Context(config, js._nc, js, store, driver,
                  tuple(driver.cards()), {}, None, None)  # type: ignore[arg-type]  # parts unused here
    assert await writes.adopt(ctx, claim) is None  # no UUID: not adopted as it is
    [active] = await writes.realise(ctx, [claim], resume=True)
    assert active.state == "active" and active.instance is not None
    assert active.instance.gi_id == left.gi_id and active.instance.uuid.startswith("MIG-")
    assert [i.uuid for i in driver.instances(0)] == [active.instance.uuid]


def test_a_claim_of_a_predecessor_owns_its_successor_only_where_the_vendor_reuses_identity(
    harness: Harness,
) -> None:
    """NVIDIA and T-Head reproduce the UUID at the same slot: a stale claim would own the
    successor, which is why partkeeper never acts on one. Hygon issues a fresh UUID: the stale
    claim's instance is vanished and the successor foreign, so nothing destroys it for the claim."""
    profile, start = harness.away_from_zero
    first = harness.driver.create(InstanceSpec(0, profile.name, start))
    claim, doc = _recorded(first, "active")
    harness.driver.destroy(first)
    successor = harness.driver.create(InstanceSpec(0, profile.name, start))
    inv = inventory.classify(doc, [successor], harness.driver.same_partition)
    if harness.reproduces_identity:
        assert inv.owned == {claim.id: successor}
    else:
        assert inv.owned == {} and inv.vanished == [claim.id] and inv.foreign == [successor]
