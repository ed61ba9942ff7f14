"""The allocator's other pure decisions: token health, retry recognition, what to reclaim, which
container an Allocate serves, and the slice activation transition."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from partkeeper.claims import TransitionError, machine
from partkeeper.drivers import Card, Instance
from partkeeper.drivers.base import slot_identity
from partkeeper.drivers.profiles import model
from schemas import CardClaims, Claim, ContainerRequest, LiveInstance, PodRecord
from schemas.events import ClaimState
from services.allocator.core import catalog, tokens
from services.allocator.core.placement import Snapshot
from services.allocator.deviceplugin import decide as blockers
from services.allocator.deviceplugin import decide as podmatch
from services.allocator.deviceplugin import decide as retry
from tests_support import UID, make_claim

OTHER = "7c1e1a4e-1111-4e5f-8a9b-0c1d2e3f4a5b"
R = "nvidia.com/mig-test"


def claim(cid: str, tokens_: list[str], *, state: ClaimState = "active", uid: str = UID,
          container: str = "main", created: float = 0.0, start: int = 0, size: int = 1,
          card: int = 0, resource: str = R) -> Claim:
    return msgspec.structs.replace(
        make_claim(cid, start, size, card=card, state=state, uid=uid),
        device_ids=tokens_, container=container, created_at=created, resource=resource,
    )


# -- token health -----------------------------------------------------------------------------

TOKENS = ("t0", "t1", "t2", "t3")


@pytest.mark.parametrize(
    ("claims", "dead", "placeable", "expected"),
    [
        pytest.param([], set(), 2, [True, True, False, False], id="as many Healthy as fit"),
        pytest.param([claim("a", ["t2"])], set(), 1, [True, False, True, False],
                     id="held by a live active claim: Healthy"),
        pytest.param([claim("a", ["t0"], state="creating")], set(), 0,
                     [True, False, False, False], id="creating for a live Pod: held, Healthy"),
        pytest.param([claim("a", ["t0"], state="releasing")], set(), 3,
                     [False, True, True, True], id="releasing: Unhealthy until removed"),
        pytest.param([claim("a", ["t0"])], {UID}, 0, [False, False, False, False],
                     id="Pod finished or gone: Unhealthy"),
        pytest.param([claim("a", ["t1"], uid=OTHER, created=1), claim("b", ["t1"], created=2)],
                     {OTHER}, 0, [False, True, False, False],
                     id="a re-used token follows its newest claim"),
        pytest.param([], set(), 9, [True, True, True, True], id="never more than the set"),
    ],
)
def test_health_table(claims, dead, placeable, expected) -> None:
    held = tokens.holds(claims, R, lambda uid: uid in dead)
    assert list(tokens.health(TOKENS, held, placeable).values()) == expected


def test_a_claim_on_a_failed_card_holds_its_token_unhealthy() -> None:
    """DESIGN.md, "Card health": the tokens a failed card's claims hold are Unhealthy; the others
    are judged as ever. Without the `failed` judgement the live Pod's token stays Healthy."""
    on_failed, elsewhere = claim("a", ["t0"]), claim("b", ["t1"], uid=OTHER)
    held = tokens.holds([on_failed, elsewhere], R, lambda uid: False,
                        lambda c: c.id == on_failed.id)
    assert list(tokens.health(TOKENS, held, 1).values()) == [False, True, True, False]


holds = st.dictionaries(
    st.sampled_from(TOKENS),
    st.builds(tokens.Hold, claim_id=st.text(min_size=1, max_size=3),
              state=st.sampled_from(["creating", "active", "releasing"]),
              pod_dead=st.booleans(), created_at=st.floats(0, 10)),
)


@given(holds, st.integers(-2, 8))
@settings(max_examples=300, deadline=None)
def test_health_properties(held, placeable) -> None:
    result = tokens.health(TOKENS, held, placeable)
    assert list(result) == list(TOKENS)  # the set is stable, in token order
    for token, hold in held.items():
        dead_or_releasing = hold.state == "releasing" or hold.pod_dead
        assert result[token] is (not dead_or_releasing)
    free = [t for t in TOKENS if t not in held]
    healthy_free = [t for t in free if result[t]]
    assert len(healthy_free) == min(max(placeable, 0), len(free))
    assert healthy_free == free[: len(healthy_free)]


# -- retry recognition ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claims", "ids", "expected"),
    [
        pytest.param([claim("a", ["t0"])], ["t0"], ["a"], id="same IDs: retry"),
        pytest.param([claim("a", ["t0"]), claim("b", ["t1"])], ["t0", "t1"], ["a", "b"],
                     id="several partitions of one container"),
        pytest.param([claim("a", ["t0"], state="creating")], ["t0"], ["a"],
                     id="a creating claim is completed, not duplicated"),
        pytest.param([claim("a", ["t0"], state="releasing")], ["t0"], [], id="releasing: no"),
        pytest.param([claim("a", ["t0"]), claim("b", ["t1"], uid=OTHER)], ["t0", "t1"], [],
                     id="spread over two Pods: re-used tokens, a new allocation"),
        pytest.param([claim("a", ["t0"])], ["t0", "t1"], [], id="only some IDs, active: new"),
        pytest.param([claim("a", ["t0"], state="creating")], ["t0", "t1"], ["a"],
                     id="only some IDs, all creating: a group cut short, resumed"),
        pytest.param([claim("a", ["t0"], state="creating")], ["t1"], [], id="other IDs: new"),
        pytest.param([claim("a", ["t0"], uid=OTHER, created=1), claim("b", ["t0"], created=2)],
                     ["t0"], ["b"], id="the newest holder of a re-used token"),
        pytest.param([claim("a", ["t0"], resource="other")], ["t0"], [], id="other resource"),
    ],
)
def test_retry_table(claims, ids, expected) -> None:
    assert sorted(c.id for c in retry.existing(claims, R, ids)) == expected


# -- what to reclaim --------------------------------------------------------------------------

H100 = Card(0, "GPU-0", "H100-80GB", "partition", model("H100-80GB").memory_mib)
OFFERS = catalog.offers([H100], prefix="nvidia.com/mig-", sliced_resource="s",
                        slices_per_card=4)
SEVEN = OFFERS["nvidia.com/mig-7g.80gb"]
THREE = OFFERS["nvidia.com/mig-3g.40gb"]


def snap(claims: list[Claim], instances: list[Instance], dead: set[str]) -> Snapshot:
    doc = CardClaims(node="n", card=0, claims={c.id: c for c in claims})
    return Snapshot({0: H100}, {0: doc}, {0: 1}, {0: tuple(instances)}, slot_identity,
                    frozenset(dead))


def live(c: Claim, gi: int) -> tuple[Claim, Instance]:
    inst = Instance(0, c.profile, c.start, c.size, gi, 0, f"MIG-{gi}")
    return (msgspec.structs.replace(c, instance=LiveInstance(gi_id=gi, ci_id=0, uuid=inst.uuid)),
            inst)


def test_reclaim_plan_names_only_the_dead_holders_in_the_way() -> None:
    a, ia = live(claim("a", ["x"], start=0, size=4, uid=OTHER), 1)
    b, ib = live(claim("b", ["y"], start=4, size=4), 2)
    # 3g fits at 4 once b (dead) is destroyed; a (live) stays.
    plan = blockers.reclaim_plan(THREE, snap([a, b], [ia, ib], {UID}), 1)
    assert plan is not None and [c.id for c in plan] == ["b"]
    # 7g needs the whole card: a is live, so there is no plan, and a's Pod is a suspect.
    assert blockers.reclaim_plan(SEVEN, snap([a, b], [ia, ib], {UID}), 1) is None
    assert blockers.suspects(SEVEN, snap([a, b], [ia, ib], {UID})) == [OTHER]


def test_reclaim_plan_counts_foreign_instances_and_releasing_claims() -> None:
    b, ib = live(claim("b", ["y"], start=4, size=4, state="releasing"), 2)
    foreign = Instance(0, "1g.10gb", 0, 1, 3, 0, "MIG-foreign")
    assert blockers.reclaim_plan(SEVEN, snap([b], [ib, foreign], set()), 1) is None
    plan = blockers.reclaim_plan(THREE, snap([b], [ib, foreign], set()), 1)
    assert plan is not None and [c.id for c in plan] == ["b"]
    text = blockers.describe(SEVEN, snap([b], [ib, foreign], set()), 1, "n1", 30)
    assert "foreign 1g.10gb at slices 0 (MIG-foreign)" in text and "claim b releasing" in text


# -- which container an Allocate serves -------------------------------------------------------


def pod(uid: str, name: str, *containers: tuple[str, int]) -> PodRecord:
    return PodRecord(node="n", uid=uid, namespace="default", name=name, phase="Pending",
                     state="live", containers=[ContainerRequest(name=c, requests={R: q})
                                               for c, q in containers],
                     resource_version="1", updated_at=0)


A = pod(UID, "a", ("init", 2), ("main", 1))
B = pod(OTHER, "b", ("main", 1))


@pytest.mark.parametrize(
    ("claimed", "kubelet", "expected"),
    [
        pytest.param(set(), None, [("a", "main"), ("b", "main")],
                     id="several left: to be confirmed, never guessed; quantity must match"),
        pytest.param({(UID, "main")}, None, [("b", "main")], id="claimed containers skipped"),
        pytest.param(set(), {("default", "b"): {"main": frozenset()},
                             ("default", "a"): {"main": frozenset({R})}}, [("b", "main")],
                     id="narrowed to what kubelet is admitting"),
        pytest.param(set(), {}, [], id="kubelet admits none of them"),
    ],
)
def test_survivors_table(claimed, kubelet, expected) -> None:
    found = podmatch.survivors([A, B], R, 1, claimed, kubelet)
    assert [(t.name, t.container) for t in found] == expected


def test_survivors_skip_malformed_uids() -> None:
    bad = msgspec.structs.replace(B, uid="../../etc")
    assert podmatch.survivors([bad], R, 1, set(), None) == []


# -- the slice activation transition (a new transition of the claim machine) -----------------


def slice_claim(cid: str, start: int, state: ClaimState = "creating") -> Claim:
    return msgspec.structs.replace(make_claim(cid, start, 1, state=state), kind="slice",
                                   profile="sliced")


class SliceMachine(RuleBasedStateMachine):
    """Random begin/activate_slice/activate/release/remove on a document with both kinds."""

    def __init__(self) -> None:
        super().__init__()
        self.doc = machine.empty("n", 0)
        self.n = 0

    @rule(start=st.integers(0, 3), kind=st.sampled_from(["slice", "partition"]))
    def begin(self, start: int, kind: str) -> None:
        self.n += 1
        new = slice_claim(f"c{self.n}", start) if kind == "slice" else make_claim(
            f"c{self.n}", start, 1)
        with contextlib.suppress(TransitionError):
            self.doc = machine.begin(self.doc, new)

    @rule(data=st.data())
    def activate_slice(self, data: st.DataObject) -> None:
        if not self.doc.claims:
            return
        cid = data.draw(st.sampled_from(sorted(self.doc.claims)))
        before = self.doc.claims[cid]
        try:
            after = machine.activate_slice(self.doc, cid, 5.0)
        except TransitionError:
            assert before.kind != "slice" or before.state != "creating"
            return
        assert before.kind == "slice" and before.state == "creating"
        assert after.claims[cid].state == "active" and after.claims[cid].instance is None
        assert {k: v for k, v in after.claims.items() if k != cid} == {
            k: v for k, v in self.doc.claims.items() if k != cid}
        self.doc = after

    @rule(data=st.data())
    def release_or_remove(self, data: st.DataObject) -> None:
        if not self.doc.claims:
            return
        cid = data.draw(st.sampled_from(sorted(self.doc.claims)))
        try:
            self.doc = machine.release(self.doc, cid, "test", 6.0)
            self.doc = machine.remove(self.doc, cid)
        except TransitionError:
            pass

    @invariant()
    def slices_never_overlap_and_have_no_instance(self) -> None:
        starts = [c.start for c in self.doc.claims.values() if c.kind == "slice"]
        assert len(starts) == len(set(starts))
        assert all(c.instance is None for c in self.doc.claims.values() if c.kind == "slice")


TestSliceMachine = SliceMachine.TestCase
TestSliceMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
