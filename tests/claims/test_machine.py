"""The claim state machine: allowed transitions only, never an overlap, unknown states refused."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from partkeeper.claims import machine
from partkeeper.claims.machine import TransitionError
from partkeeper.drivers.profiles import overlaps
from schemas import CardClaims, Claim, LiveInstance
from schemas.events import ClaimState

UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


def claim(cid: str, start: int, size: int, state: ClaimState = "creating") -> Claim:
    return Claim(
        id=cid, state=state, pod_uid=UID, namespace="d", name="p", container="c",
        resource="nvidia.com/mig-x", device_ids=[cid], card=0, profile="x", start=start,
        size=size, created_at=0, updated_at=0,
    )


LIVE = LiveInstance(gi_id=1, ci_id=0, uuid="MIG-1")


def test_happy_path() -> None:
    doc = machine.begin(machine.empty("n", 0), claim("a", 0, 2))
    doc = machine.activate(doc, "a", LIVE, 1)
    assert doc.claims["a"].state == "active" and doc.claims["a"].instance == LIVE
    doc = machine.release(doc, "a", "PodGone", 2)
    assert machine.release(doc, "a", "again", 3) is doc
    doc = machine.remove(doc, "a")
    assert doc.claims == {}


@pytest.mark.parametrize(
    ("state", "step"),
    [
        ("active", lambda d: machine.activate(d, "a", LIVE, 1)),
        ("active", lambda d: machine.remove(d, "a")),
        ("active", lambda d: machine.remove(d, "a", abandon=True)),
        ("creating", lambda d: machine.remove(d, "a")),
        ("releasing", lambda d: machine.activate(d, "a", LIVE, 1)),
        ("exploded", lambda d: machine.release(d, "a", "x", 1)),
    ],
)
def test_refused_transitions(state: str, step) -> None:
    # `state` may be one no version writes ("exploded"): refused like any illegal transition.
    doc = CardClaims(node="n", card=0, claims={"a": claim("a", 0, 1, state)})  # type: ignore[arg-type]
    with pytest.raises(TransitionError):
        step(doc)


def test_abandon_refuses_a_claim_that_has_an_instance() -> None:
    doc = machine.begin(machine.empty("n", 0), claim("a", 0, 1))
    doc = machine.record_instance(doc, "a", LIVE, 1)
    with pytest.raises(TransitionError, match="never-activated"):
        machine.remove(doc, "a", abandon=True)


def test_begin_refuses_overlap_with_any_state() -> None:
    for state in ("creating", "active", "releasing"):
        doc = CardClaims(node="n", card=0, claims={"a": claim("a", 0, 4, state)})
        with pytest.raises(TransitionError, match="overlaps"):
            machine.begin(doc, claim("b", 2, 2))


class ClaimMachine(RuleBasedStateMachine):
    """Random sequences of transitions keep the document consistent."""

    def __init__(self) -> None:
        super().__init__()
        self.doc = machine.empty("n", 0)
        self.n = 0

    @rule(start=st.integers(0, 7), size=st.sampled_from([1, 2, 4, 8]))
    def begin(self, start: int, size: int) -> None:
        self.n += 1
        new = claim(f"c{self.n}", start, size)
        clash = any(overlaps((start, size), (c.start, c.size)) for c in self.doc.claims.values())
        try:
            self.doc = machine.begin(self.doc, new)
        except TransitionError:
            assert clash
        else:
            assert not clash

    @precondition(lambda self: bool(self.doc.claims))
    @rule(data=st.data(), op=st.sampled_from(["activate", "release", "remove", "abandon"]))
    def step(self, data: st.DataObject, op: str) -> None:
        cid = data.draw(st.sampled_from(sorted(self.doc.claims)))
        before = self.doc.claims[cid].state
        try:
            if op == "activate":
                self.doc = machine.activate(self.doc, cid, LIVE, 1)
            elif op == "release":
                self.doc = machine.release(self.doc, cid, "gone", 1)
            else:
                self.doc = machine.remove(self.doc, cid, abandon=op == "abandon")
        except TransitionError:
            assert cid in self.doc.claims and self.doc.claims[cid].state == before
            return
        after = self.doc.claims[cid].state if cid in self.doc.claims else "removed"
        assert after == before or after in machine.ALLOWED[before]
        if op == "remove":
            assert before == "releasing"
        if op == "abandon":
            assert before in ("creating", "releasing")

    @invariant()
    def no_overlap_and_known_states(self) -> None:
        claims = list(self.doc.claims.values())
        for i, a in enumerate(claims):
            assert a.state in machine.ALLOWED
            assert a.state != "active" or a.instance is not None
            for b in claims[i + 1 :]:
                assert not overlaps((a.start, a.size), (b.start, b.size))
        assert msgspec.json.decode(msgspec.json.encode(self.doc), type=CardClaims) == self.doc


TestClaimMachine = ClaimMachine.TestCase
