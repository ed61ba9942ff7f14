"""From API answers to observations: a LIST never declares absent what it cannot show absent
(invariant 9: a partial or untrustworthy read is never taken as absence); the pending query."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import ContainerRequest, PodRecord
from schemas.pods import PodPhase, PodState
from services.watcher import answers
from services.watcher.decide import Absent, Deleted, Seen, decide
from services.watcher.observe import Listing, NotFound, from_get, from_list, from_watch
from services.watcher.pods import Resources

NODE = "node-a"
OURS = Resources("nvidia.com/mig-", "nvidia.com/gpu.sliced")
A = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
B = "1c7f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
C = "2d8f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


def obj(uid: Any, name: str, rv: str = "5", **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": name, "namespace": "ns", "resourceVersion": rv,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
        "status": {"phase": extra.get("phase", "Pending")},
    }


def rec(uid: str, name: str, rv: str = "5", state: PodState = "live", *,
        phase: PodPhase = "Pending", created: str = "2026-01-01T00:00:00Z", deleting: bool = False,
        requests: dict[str, int] | None = None) -> PodRecord:
    return PodRecord(
        node=NODE, uid=uid, namespace="ns", name=name, phase=phase,
        state=state, deleting=deleting, created=created,
        containers=[ContainerRequest(name="main", requests=requests or {})],
        resource_version=rv, evidence="test", updated_at=0,
    )


def absent_uids(observations: list[Any]) -> set[str]:
    return {o.uid for o in observations if isinstance(o, Absent)}


def test_a_list_sees_its_items_and_lacks_the_rest() -> None:
    records = [rec(A, "a"), rec(B, "b"), rec(C, "c", state="gone")]
    readings = from_list(records, Listing([obj(A, "a")], "9"), node=NODE, resources=OURS)
    assert [o.pod.uid for o in readings.observations if isinstance(o, Seen)] == [A]
    assert absent_uids(readings.observations) == {B}  # a tombstone is not re-declared
    assert readings.absence_withheld is None


@pytest.mark.parametrize(
    ("items", "list_rv", "absent", "withheld"),
    [
        # A malformed item under a known Pod's name may be that Pod: it shields it.
        ([obj("../../etc", "b")], "9", set(), False),
        ([obj(A.upper(), "b")], "9", set(), False),
        ([{**obj(B, "b"), "status": "broken"}], "9", set(), False),
        # An item naming nothing could be anyone: no absence at all from this LIST.
        ([{"metadata": {"uid": B}}], "9", set(), True),
        (["not an object"], "9", set(), True),
        # A LIST whose version cannot be ordered proves nothing.
        ([], "", set(), True),
        ([], "abc", set(), True),
        # A malformed item of another name shields only that name.
        ([obj("../x", "zzz")], "9", {B}, False),
    ],
)
def test_absence_is_withheld_when_the_list_cannot_show_it(
    items: list[Any], list_rv: str, absent: set[str], withheld: bool
) -> None:
    readings = from_list([rec(B, "b")], Listing(items, list_rv), node=NODE, resources=OURS)
    assert absent_uids(readings.observations) == absent
    assert (readings.absence_withheld is not None) == withheld


def test_a_stale_list_declares_nothing_gone() -> None:
    """The LIST may lack a Pod because it predates it; decide() refuses it as evidence."""
    record = rec(B, "b", rv="12")
    readings = from_list([record], Listing([], "9"), node=NODE, resources=OURS)
    (absent,) = readings.observations
    assert decide(NODE, record, absent, 1.0).event is None


@given(
    known=st.lists(st.integers(1, 40), min_size=1, max_size=6, unique=True),
    list_rv=st.integers(1, 50),
    present=st.sets(st.integers(0, 5)),
)
def test_only_a_newer_list_lacking_a_pod_makes_it_gone(
    known: list[int], list_rv: int, present: set[int]
) -> None:
    uids = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(len(known))]
    records = [rec(uid, f"p{i}", rv=str(rv)) for i, (uid, rv) in enumerate(zip(uids, known,
                                                                                 strict=True))]
    listed = [obj(uids[i], f"p{i}", rv=str(known[i])) for i in present if i < len(uids)]
    readings = from_list(records, Listing(listed, str(list_rv)), node=NODE, resources=OURS)
    by_uid = {r.uid: r for r in records}
    for observation in readings.observations:
        decision = decide(NODE, by_uid.get(observation.uid if isinstance(observation, Absent)
                                           else observation.pod.uid), observation, 1.0)
        if decision.record is not None and decision.record.state == "gone":
            uid = decision.record.uid
            assert int(by_uid[uid].resource_version) < list_rv
            assert uid not in {item["metadata"]["uid"] for item in listed}


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        ({"type": "ADDED", "object": obj(A, "a")}, Seen),
        ({"type": "MODIFIED", "object": obj(A, "a")}, Seen),
        ({"type": "DELETED", "object": obj(A, "a")}, Deleted),
        ({"type": "DELETED", "object": obj("../../etc", "a")}, None),
        ({"type": "ADDED", "object": "garbage"}, None),
        ({"type": "EXPLODED", "object": obj(A, "a")}, None),
        ({"object": obj(A, "a")}, None),
        ("a string", None),
    ],
)
def test_watch_events(event: Any, kind: type | None) -> None:
    readings = from_watch(event, node=NODE, resources=OURS)
    if kind is None:
        assert not readings.observations and len(readings.skipped) == 1
    else:
        assert [type(o) for o in readings.observations] == [kind]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (NotFound(), ("get-404", "")),
        (obj(B, "a", rv="20"), ("get-other-uid", "20")),
        (obj(A, "a", rv="20"), Seen),
        # An odd uid under the name is a malformed object, not evidence.
        (obj("../../etc", "a"), None),
        (obj(None, "a"), None),
        ("garbage", None),
    ],
)
def test_get_answers(answer: Any, expected: Any) -> None:
    readings = from_get(rec(A, "a"), answer, node=NODE, resources=OURS)
    if expected is None:
        assert not readings.observations and readings.skipped
    elif expected is Seen:
        assert isinstance(readings.observations[0], Seen)
    else:
        (absent,) = readings.observations
        assert isinstance(absent, Absent)
        assert (absent.evidence, absent.resource_version) == expected


MIG = "nvidia.com/mig-1g.10gb"


def test_pending_pods_oldest_first_exact_quantity() -> None:
    records = [
        rec(A, "late", created="2026-01-01T00:00:09Z", requests={MIG: 1}),
        rec(B, "b", created="2026-01-01T00:00:01Z", requests={MIG: 1}),
        rec(C, "a", created="2026-01-01T00:00:01Z", requests={MIG: 1}),
        rec("3e9f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b", "two", requests={MIG: 2}),
        rec("4fa04a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b", "running", phase="Running",
            requests={MIG: 1}),
        rec("50b14a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b", "deleting", deleting=True,
            requests={MIG: 1}),
        rec("61c24a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b", "gone", state="gone", requests={MIG: 1}),
        rec("72d34a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b", "other", requests={"nvidia.com/mig-x": 1}),
    ]
    chosen = answers.pending(records, MIG, 1)
    assert [r.name for r in chosen] == ["a", "b", "late"]
    assert [r.name for r in answers.pending(records, MIG, 2)] == ["two"]


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("xyz"), st.integers(0, 99)),
                max_size=8))
def test_pending_order_is_total_and_stable(keys: list[tuple[int, str, int]]) -> None:
    records = [rec(f"{i:08x}-0000-4000-8000-000000000000", f"p{name}{n}",
                   created=f"2026-01-01T00:00:0{c}Z", requests={MIG: 1})
               for i, (c, name, n) in enumerate(keys)]
    chosen = answers.pending(records, MIG, 1)
    order = [(r.created, r.namespace, r.name) for r in chosen]
    assert order == sorted(order)
    assert answers.pending(list(reversed(records)), MIG, 1) == chosen or len(
        {(r.created, r.name) for r in records}) < len(records)
