"""Half-done operations and recorded identities on T-Head and Hygon partitions, through the claims'
inventory and the reclaimer's decision, with each vendor's identity as its driver reports it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from partkeeper.claims import inventory, machine
from partkeeper.drivers.base import Instance, InstanceSpec, UnknownError
from schemas import LiveInstance
from services.reclaimer.decide import Step, decide, sighting
from tests_support import make_claim

from .vendor_harness import make

PROFILE = {"hgml": ("4g.48gb", 4), "dmi": ("4g.31gb", 2)}


def _doc(inst: Instance, state: str):
    live = LiveInstance(gi_id=inst.gi_id, ci_id=inst.ci_id, uuid=inst.uuid)
    claim = make_claim("c1", inst.start, inst.size, card=inst.card, state=state)
    claim = machine.msgspec.structs.replace(claim, profile=inst.profile, instance=live)
    doc = machine.empty("n", inst.card)
    return claim, machine.msgspec.structs.replace(doc, claims={claim.id: claim})


@pytest.mark.parametrize("kind", ["hgml", "dmi"])
def test_a_half_done_destroy_is_finished_and_the_slot_comes_back(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor_libraries: dict[str, Path]
) -> None:
    vh = make(kind, tmp_path, monkeypatch, vendor_libraries)
    assert vh.rig is not None
    profile, start = PROFILE[kind]
    inst = vh.driver.create(InstanceSpec(0, profile, start))
    claim, doc = _doc(inst, "releasing")
    vh.rig.fake.fail(f"{'hgml' if kind == 'hgml' else 'nvml'}GpuInstanceDestroy", 999)
    with pytest.raises(UnknownError):
        vh.driver.destroy(inst)
    [left] = vh.driver.instances(0)
    assert (left.gi_id, left.ci_id, left.uuid) == (inst.gi_id, -1, "")
    inv = inventory.classify(doc, [left], vh.driver.same_partition)
    assert inv.owned == {claim.id: left} and inv.foreign == []
    seen = sighting(doc, claim.id, [left], vh.driver.same_partition)
    step = decide(claim, seen, "gone", time.time(), create_timeout=30)
    assert step.step is Step.DESTROY and step.instance == left
    vh.driver.destroy(step.instance)
    assert vh.driver.instances(0) == []
    assert vh.driver.create(InstanceSpec(0, profile, start)).gi_id == inst.gi_id


@pytest.mark.parametrize("kind", ["hgml", "dmi"])
def test_a_claim_of_a_predecessor_owns_its_successor_only_where_the_vendor_reuses_identity(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor_libraries: dict[str, Path]
) -> None:
    """T-Head reproduces the UUID at the same slot (as NVIDIA): a stale claim would own the
    successor, which is why partkeeper never acts on one. Hygon issues a fresh UUID: the stale
    claim's instance is vanished and the successor foreign, so nothing destroys it for the claim."""
    vh = make(kind, tmp_path, monkeypatch, vendor_libraries)
    profile, start = PROFILE[kind]
    first = vh.driver.create(InstanceSpec(0, profile, start))
    claim, doc = _doc(first, "active")
    vh.driver.destroy(first)
    successor = vh.driver.create(InstanceSpec(0, profile, start))
    inv = inventory.classify(doc, [successor], vh.driver.same_partition)
    if kind == "hgml":
        assert inv.owned == {claim.id: successor}
    else:
        assert inv.owned == {} and inv.vanished == [claim.id] and inv.foreign == [successor]
