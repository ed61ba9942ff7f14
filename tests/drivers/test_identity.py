"""Identity is per driver: each vendor's rule (`Driver.same_partition`), and that the claims
inventory and destroy ask it rather than comparing identities themselves.

The contract suite checks each real driver's rule on its fake library; here the rules are pinned
as tables, and a seeded model-based run drives the sim over one NVIDIA, one T-Head and one Hygon
card to check that what the driver lists, what `same_partition` says and what `destroy` does with
a stale record always agree.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
)

from partkeeper.claims import inventory
from partkeeper.drivers import profiles
from partkeeper.drivers.base import (
    IdentityMismatchError,
    IdentityRule,
    Instance,
    InstanceSpec,
    NotFoundError,
    PlacementError,
    issued_identity,
    slot_identity,
)
from partkeeper_sim.driver import SimDriver, init_state
from schemas import CardClaims, LiveInstance
from tests_support import make_claim

RECORDED = Instance(0, "1g.10gb", 2, 1, gi_id=5, ci_id=0, uuid="MIG-aaaa")
# GI left without its compute instance by an interrupted destroy, at the recorded slot.
REMNANT = dataclasses.replace(RECORDED, ci_id=-1, uuid="")

# (listed, slot rule says, issued rule says): what each vendor's rule makes of one listing.
CASES = [
    (RECORDED, True, True),
    (REMNANT, True, True),
    (dataclasses.replace(REMNANT, gi_id=6), False, False),  # another GI's remnant
    (dataclasses.replace(REMNANT, start=3), False, False),
    (dataclasses.replace(RECORDED, uuid="MIG-bbbb"), False, False),  # a successor, fresh UUID
    (dataclasses.replace(RECORDED, start=3), False, False),
    (dataclasses.replace(RECORDED, profile="1g.20gb"), False, False),
    (dataclasses.replace(RECORDED, card=1), False, False),
    (dataclasses.replace(RECORDED, ci_id=1), True, True),  # the CI id is not part of either
    # The one place the rules part: Hygon's UUID names the partition whatever GI id it sits on;
    # NVIDIA's and T-Head's is derived from the slot, so the GI id is part of it.
    (dataclasses.replace(RECORDED, gi_id=6), False, True),
]


@pytest.mark.parametrize(("listed", "slot", "issued"), CASES)
def test_each_vendors_rule(listed: Instance, slot: bool, issued: bool) -> None:
    assert slot_identity(RECORDED, listed) is slot
    assert issued_identity(RECORDED, listed) is issued


def _doc(records: list[Instance]) -> CardClaims:
    """A card's claims document with one active claim per recorded instance, named by its UUID."""
    claims = {}
    for inst in records:
        live = LiveInstance(gi_id=inst.gi_id, ci_id=inst.ci_id, uuid=inst.uuid)
        claim = msgspec.structs.replace(
            make_claim(inst.uuid, inst.start, inst.size, card=inst.card, state="active"),
            profile=inst.profile, instance=live,
        )
        claims[claim.id] = claim
    return CardClaims(node="n", card=records[0].card if records else 0, claims=claims)


@pytest.mark.parametrize("rule", [slot_identity, issued_identity, lambda recorded, listed: False])
def test_the_inventory_owns_exactly_what_the_drivers_rule_says(rule: IdentityRule) -> None:
    moved = dataclasses.replace(RECORDED, gi_id=6)
    doc = _doc([RECORDED])
    inv = inventory.classify(doc, [moved], rule)
    if rule(RECORDED, moved):
        assert inv.owned == {RECORDED.uuid: moved} and inv.foreign == [] and inv.vanished == []
    else:
        assert inv.owned == {} and inv.foreign == [moved] and inv.vanished == [RECORDED.uuid]


MODELS = ["H100-80GB", "PPU-96GB", "DCU-64GB"]  # one card of each vendor, in partition mode


def _vendor(card: int) -> str:
    return profiles.model(MODELS[card]).vendor


def test_the_sim_asks_the_rule_of_each_cards_vendor(tmp_path: Path) -> None:
    init_state(tmp_path / "sim.json", MODELS, [])
    driver = SimDriver(tmp_path / "sim.json")
    for card in range(len(MODELS)):
        recorded = dataclasses.replace(RECORDED, card=card)
        moved = dataclasses.replace(recorded, gi_id=recorded.gi_id + 1)
        assert driver.same_partition(recorded, moved) is (_vendor(card) == "hygon")


class SimIdentity(RuleBasedStateMachine):
    """Creates and destroys on three vendors' cards, keeping every identity the driver reported.

    After every step: each live record is matched by exactly its own listed instance; a record of
    a destroyed partition is matched only by a successor reproducing its identity (NVIDIA and
    T-Head), never on Hygon; the inventory agrees; and `destroy` with a stale record destroys
    exactly what `same_partition` matches, refusing everything else."""

    live = Bundle("live")

    def __init__(self) -> None:
        super().__init__()
        self._dir = Path(tempfile.mkdtemp(prefix="pk-identity"))
        init_state(self._dir / "sim.json", MODELS, [])
        self.driver = SimDriver(self._dir / "sim.json")
        self.records: list[Instance] = []  # live, as create reported them
        self.stale: list[Instance] = []  # destroyed, as create reported them

    def teardown(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    @rule(target=live, card=st.integers(0, len(MODELS) - 1), pick=st.integers(0, 63))
    def create(self, card: int, pick: int) -> Instance | object:
        shapes = list(profiles.model(MODELS[card]).profiles.values())
        shape = shapes[pick % len(shapes)]
        start = shape.starts[pick // len(shapes) % len(shape.starts)]
        taken = [r.placement for r in self.records if r.card == card]
        if any(profiles.overlaps((start, shape.size), t) for t in taken):
            with pytest.raises(PlacementError):
                self.driver.create(InstanceSpec(card, shape.name, start))
            return multiple()
        made = self.driver.create(InstanceSpec(card, shape.name, start))
        self.records.append(made)
        return made

    @rule(inst=consumes(live))
    def destroy(self, inst: Instance) -> None:
        if inst not in self.records:
            return  # already destroyed through a stale record that reproduced its identity
        self.driver.destroy(inst)
        self.records.remove(inst)
        self.stale.append(inst)

    @rule(pick=st.integers(0, 63))
    def destroy_with_a_stale_record(self, pick: int) -> None:
        if not self.stale:
            return
        old = self.stale[pick % len(self.stale)]
        at_gi = [i for i in self.driver.instances(old.card) if i.gi_id == old.gi_id]
        if not at_gi:
            with pytest.raises(NotFoundError):
                self.driver.destroy(old)
        elif self.driver.same_partition(old, at_gi[0]):
            self.driver.destroy(old)  # the successor reproduced the identity: it is the same
            [gone] = [r for r in self.records if (r.card, r.gi_id) == (old.card, old.gi_id)]
            self.records.remove(gone)
            self.stale.append(gone)
        else:
            with pytest.raises(IdentityMismatchError):
                self.driver.destroy(old)

    @invariant()
    def identities_agree(self) -> None:
        for card in range(len(MODELS)):
            listed = self.driver.instances(card)
            mine = [r for r in self.records if r.card == card]
            assert sorted(listed, key=lambda i: i.gi_id) == sorted(mine, key=lambda i: i.gi_id)
            for record in mine:
                assert [i for i in listed if self.driver.same_partition(record, i)] == [record]
            for old in (o for o in self.stale if o.card == card):
                matched = [i for i in listed if self.driver.same_partition(old, i)]
                if _vendor(card) == "hygon":
                    assert matched == [], "a Hygon successor took its predecessor's identity"
                else:
                    assert matched in ([], [old]), "only a reproduced identity may match"
            inv = inventory.classify(_doc(mine), listed, self.driver.same_partition)
            assert inv.owned == {r.uuid: r for r in mine} and inv.foreign == []


SimIdentity.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_sim_identity_is_each_vendors = SimIdentity.TestCase
