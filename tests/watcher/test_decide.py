"""The watcher's one decision: what event an observation produces given the persisted record.

A table of every case, then hypothesis: any truthful observations of a Pod's history, in any
order and with any repetition, never announce a live Pod gone, never announce a fact twice, and
lose no death that was observed (invariants 1 and 6 from the watcher's side).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import ContainerRequest, PodGone, PodRecord
from schemas.names import encode_token
from schemas.pods import PodPhase, PodState
from services.watcher.decide import Absent, Deleted, Observation, Seen, decide, msg_id
from services.watcher.pods import PodFacts

NODE = "node-a"
UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
MAIN = (ContainerRequest(name="main", requests={"nvidia.com/mig-1g.10gb": 1}),)


def facts(rv: int, phase: PodPhase = "Pending", *, deleting: bool = False,
          containers: tuple[ContainerRequest, ...] = MAIN) -> PodFacts:
    return PodFacts(uid=UID, namespace="ns", name="p", phase=phase,
                    deleting=deleting, created="2026-01-01T00:00:00Z", containers=containers,
                    resource_version=str(rv), rv=rv)


def record(state: PodState, rv: str = "5", phase: PodPhase = "Pending") -> PodRecord:
    return PodRecord(node=NODE, uid=UID, namespace="ns", name="p", phase=phase,
                     state=state, created="2026-01-01T00:00:00Z",
                     containers=list(MAIN), resource_version=rv, evidence="test",
                     gone_evidence="deleted" if state == "gone" else None, updated_at=0)


def relist(rv: str) -> Absent:
    return Absent(UID, "relist", rv, f"absent from LIST at {rv}")


GET_404 = Absent(UID, "get-404", "", "GET returned 404")
OTHER_UID = Absent(UID, "get-other-uid", "9", "GET returned another uid")

CASES: list[tuple[str, PodRecord | None, Observation, str | None, str | None]] = [
    # (case, record, observation, event published, state written)
    ("first seen pending", None, Seen(facts(6), "list"), "PodSeen", "live"),
    ("first seen terminating", None, Seen(facts(6, deleting=True), "list"), "PodSeen", "live"),
    ("first seen finished", None, Seen(facts(6, "Succeeded"), "list"), "PodFinished", "finished"),
    ("first seen deleted", None, Deleted(facts(6)), "PodGone", "gone"),
    ("absent, never seen", None, relist("9"), None, None),
    ("404, never seen", None, GET_404, None, None),
    ("no relevant change", record("live"), Seen(facts(6), "watch MODIFIED"), None, None),
    ("running", record("live"), Seen(facts(6, "Running"), "watch MODIFIED"), "PodSeen", "live"),
    ("terminating is live", record("live"), Seen(facts(6, deleting=True), "watch MODIFIED"),
     "PodSeen", "live"),
    ("phase Unknown is live", record("live"), Seen(facts(6, "Unknown"), "list"), "PodSeen",
     "live"),
    ("containers changed", record("live"), Seen(facts(6, containers=()), "list"), "PodSeen",
     "live"),
    ("stale version", record("live"), Seen(facts(4, "Running"), "watch MODIFIED"), None, None),
    ("duplicate version", record("live"), Seen(facts(5, "Running"), "watch MODIFIED"), None,
     None),
    ("succeeded", record("live"), Seen(facts(6, "Succeeded"), "watch MODIFIED"), "PodFinished",
     "finished"),
    ("failed", record("live"), Seen(facts(6, "Failed"), "list"), "PodFinished", "finished"),
    ("deleted", record("live"), Deleted(facts(6)), "PodGone", "gone"),
    ("deleted, reordered", record("live"), Deleted(facts(4)), "PodGone", "gone"),
    ("absent from a newer LIST", record("live"), relist("6"), "PodGone", "gone"),
    ("absent from a LIST at the same version", record("live"), relist("5"), None, None),
    ("absent from a stale LIST", record("live"), relist("4"), None, None),
    ("absent from a LIST with an opaque version", record("live"), relist("abc"), None, None),
    ("record with an opaque version", record("live", rv="abc"), relist("6"), None, None),
    ("GET 404", record("live"), GET_404, "PodGone", "gone"),
    ("GET another uid", record("live"), OTHER_UID, "PodGone", "gone"),
    ("finished never runs again", record("finished"), Seen(facts(6, "Running"), "list"), None,
     None),
    ("finished, then terminating", record("finished"),
     Seen(facts(6, "Failed", deleting=True), "list"), None, None),
    ("finished, deleted", record("finished"), Deleted(facts(6, "Failed")), "PodGone", "gone"),
    ("finished, absent", record("finished"), relist("6"), "PodGone", "gone"),
    ("gone, seen again", record("gone"), Seen(facts(6, "Running"), "list"), None, None),
    ("gone, deleted again", record("gone"), Deleted(facts(6)), None, None),
    ("gone, absent again", record("gone"), relist("60"), None, None),
]


@pytest.mark.parametrize(("rec", "observation", "event", "state"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_decision_table(
    rec: PodRecord | None, observation: Observation, event: str | None, state: str | None
) -> None:
    decision = decide(NODE, rec, observation, now=100.0)
    assert (type(decision.event).__name__ if decision.event else None) == event
    assert (decision.record.state if decision.record else None) == state
    assert decision.reason
    if decision.event is not None:
        assert decision.record is not None
        assert decision.event.uid == decision.record.uid == UID
        assert decision.event.resource_version == decision.record.resource_version


@pytest.mark.parametrize(
    ("observation", "evidence", "rv"),
    [(Deleted(facts(6)), "deleted", "6"), (relist("8"), "relist", "8"),
     (GET_404, "get-404", "5"), (OTHER_UID, "get-other-uid", "9")],
)
def test_gone_names_its_evidence_and_version(observation: Observation, evidence: str,
                                             rv: str) -> None:
    decision = decide(NODE, record("live"), observation, now=1.0)
    assert decision.record is not None and decision.event is not None
    assert decision.record.gone_evidence == evidence
    assert isinstance(decision.event, PodGone) and decision.event.evidence == evidence
    assert decision.record.resource_version == rv  # a 404 rests on the last version seen


def test_msg_ids_name_the_fact() -> None:
    seen = decide(NODE, None, Seen(facts(6), "list"), 1.0).event
    finished = decide(NODE, None, Seen(facts(6, "Failed"), "list"), 1.0).event
    gone = decide(NODE, None, Deleted(facts(6)), 1.0).event
    assert seen is not None and finished is not None and gone is not None
    assert msg_id(seen) == f"{encode_token(NODE)}/PodSeen/{UID}/6"
    assert msg_id(finished) == f"{encode_token(NODE)}/PodFinished/{UID}"
    assert msg_id(gone) == f"{encode_token(NODE)}/PodGone/{UID}"


# --- hypothesis: truthful observations of one Pod's history, in any order ---------------------

PHASE_ORDER: tuple[PodPhase, ...] = ("Pending", "Running")


@st.composite
def histories(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod's versions (rv increasing, phase and deletion monotonic), maybe its deletion, and
    every observation that could truthfully be made of it."""
    created = draw(st.integers(2, 50))
    steps = draw(st.integers(1, 6))
    gaps = draw(st.lists(st.integers(1, 4), min_size=steps, max_size=steps))
    rvs = [created + sum(gaps[:i]) for i in range(steps)]
    phase_at = sorted(draw(st.lists(st.integers(0, 2), min_size=steps, max_size=steps)))
    endings: tuple[PodPhase, ...] = ("Succeeded", "Failed")
    ending = draw(st.sampled_from(endings))
    delete_from = draw(st.integers(0, steps))  # versions from here on are terminating
    versions = [
        facts(rv, PHASE_ORDER[p] if p < 2 else ending, deleting=i >= delete_from)
        for i, (rv, p) in enumerate(zip(rvs, phase_at, strict=True))
    ]
    deleted = draw(st.booleans())
    observations: list[Observation] = [Seen(v, "watch") for v in versions]
    observations += [relist(str(r)) for r in range(1, created)]  # LISTs before it existed
    if deleted:
        gone_rv = rvs[-1] + 1
        observations.append(Deleted(replace(versions[-1], rv=gone_rv,
                                            resource_version=str(gone_rv))))
        observations += [relist(str(gone_rv + k)) for k in range(3)]
        observations += [GET_404, Absent(UID, "get-other-uid", str(gone_rv + 5), "other")]
    order = draw(st.lists(st.sampled_from(observations), min_size=1, max_size=25))
    return {"versions": versions, "deleted": deleted, "order": order}


def run(order: list[Observation]) -> tuple[PodRecord | None, list[Any]]:
    current: PodRecord | None = None
    published: list[Any] = []
    for observation in order:
        decision = decide(NODE, current, observation, now=1.0)
        if decision.event is not None:
            published.append(decision.event)
        if decision.record is not None:
            if current is not None and current.state != "gone":
                assert int(decision.record.resource_version) >= int(current.resource_version)
            current = decision.record
    return current, published


@settings(max_examples=400, deadline=None)
@given(histories())
def test_no_live_pod_is_ever_announced_gone(history: dict[str, Any]) -> None:
    final, published = run(history["order"])
    gone = [e for e in published if type(e).__name__ == "PodGone"]
    if not history["deleted"]:
        assert not gone
        assert final is None or final.state != "gone"


@settings(max_examples=400, deadline=None)
@given(histories())
def test_no_fact_is_announced_twice_and_nothing_follows_death(history: dict[str, Any]) -> None:
    _, published = run(history["order"])
    ids = [msg_id(e) for e in published]
    assert len(ids) == len(set(ids))
    names = [type(e).__name__ for e in published]
    if "PodGone" in names:
        assert names.index("PodGone") == len(names) - 1
    if "PodFinished" in names:
        assert all(n == "PodGone" for n in names[names.index("PodFinished") + 1:])
        assert any(v.terminal for v in history["versions"])


@settings(max_examples=400, deadline=None)
@given(histories())
def test_an_observed_deletion_is_never_lost(history: dict[str, Any]) -> None:
    final, _ = run(history["order"])
    if any(isinstance(o, Deleted) for o in history["order"]):
        assert final is not None and final.state == "gone"


@settings(max_examples=200, deadline=None)
@given(histories())
def test_replaying_after_a_restart_announces_nothing(history: dict[str, Any]) -> None:
    """Whatever announced something, observed again against the persisted record (a restart
    replaying its input), announces nothing more."""
    final, _ = run(history["order"])
    current: PodRecord | None = None
    for observation in history["order"]:
        decision = decide(NODE, current, observation, now=1.0)
        if decision.record is not None:
            current = decision.record
        if decision.event is not None:
            assert decide(NODE, current, observation, now=2.0).event is None
            assert decide(NODE, final, observation, now=2.0).event is None
