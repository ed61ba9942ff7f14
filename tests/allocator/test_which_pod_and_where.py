"""The Allocate's pure decisions, exhaustively and by property: which Pod it serves
(`decide`: kubelet's retry, the holder of handed-on IDs, the pending candidates, the one
chosen) and what follows a plan that wrote nothing (`decide.after_miss`)."""

from __future__ import annotations

import itertools
import uuid

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import Claim, ContainerRequest, PodRecord
from schemas.events import ClaimState
from services.allocator.core.placement import Target
from services.allocator.deviceplugin import decide
from services.allocator.deviceplugin.decide import Holder, KubeletView
from tests_support import UID, make_claim

R = "nvidia.com/mig-1g.10gb"
OTHER_R = "nvidia.com/mig-2g.20gb"
UIDS = [str(uuid.UUID(int=i + 1)) for i in range(4)]


def claim(cid: str, tokens: list[str], *, state: ClaimState = "active", uid: str = UID,
          container: str = "main", created: float = 0.0, resource: str = R) -> Claim:
    return msgspec.structs.replace(make_claim(cid, 0, 1, state=state, uid=uid),
                                   device_ids=tokens, container=container, created_at=created,
                                   resource=resource)


# -- the holder of device IDs an Allocate names: retry, dead, or handed on ---------------------

HELD = claim("c1", ["t0"])
# What kubelet's pod-resources API may say about the holder's Pod and container.
VIEWS: dict[str, KubeletView | None] = {
    "no answer": None,
    "Pod not listed": {},
    "container listed with the resource": {("default", "pod"): {"main": frozenset({R})}},
    "container listed without it": {("default", "pod"): {"main": frozenset()}},
    "container not listed (an init container)": {("default", "pod"): {"side": frozenset({R})}},
}
ADMITTING = {"no answer", "container listed without it",
             "container not listed (an init container)"}


@pytest.mark.parametrize(("dead", "admitted", "view"),
                         list(itertools.product([False, True], [False, True], VIEWS)))
def test_holder_every_case(dead: bool, admitted: bool, view: str) -> None:
    said = decide.holder(HELD, dead=dead, being_admitted=admitted, kubelet=VIEWS[view])
    if dead:
        expected = Holder.DEAD
    elif admitted and view in ADMITTING:
        expected = Holder.RETRY
    else:
        expected = Holder.HANDED_ON
    assert said is expected


# -- kubelet's retry: the claims carrying the IDs ----------------------------------------------

tokens = st.sampled_from(["t0", "t1", "t2", "t3", "t4"])
claims_st = st.lists(
    st.builds(
        claim,
        cid=st.text("abcdef0123456789", min_size=4, max_size=4),
        tokens=st.lists(tokens, min_size=1, max_size=2, unique=True),
        state=st.sampled_from(["creating", "active", "releasing"]),
        uid=st.sampled_from(UIDS[:2]),
        container=st.sampled_from(["main", "side"]),
        created=st.integers(0, 5).map(float),
        resource=st.sampled_from([R, OTHER_R]),
    ),
    max_size=6, unique_by=lambda c: c.id,
)


@given(claims_st, st.lists(tokens, min_size=1, max_size=3, unique=True))
@settings(max_examples=400, deadline=None)
def test_a_retry_group_is_one_containers_and_carries_only_the_ids(
    claims: list[Claim], ids: list[str]
) -> None:
    group = decide.existing(claims, R, ids)
    if not group:
        return
    assert {(c.pod_uid, c.container) for c in group} == {(group[0].pod_uid, group[0].container)}
    assert all(c.resource == R and c.state in ("creating", "active") for c in group)
    carried = {t for c in group for t in c.device_ids}
    assert carried <= set(ids)
    if carried != set(ids):  # cut short by a crash: only ever while all are still creating
        assert all(c.state == "creating" for c in group)
    missing = decide.missing(group, ids)
    assert set(missing) == set(ids) - carried
    assert missing == [t for t in ids if t in missing]  # in the request's order
    # A token several claims carry belongs to the newest: that one is in the group.
    ids_in_group = {c.id for c in group}
    for t in ids:
        holders = [o for o in claims if o.resource == R and o.state in ("creating", "active")
                   and t in o.device_ids]
        if holders:
            assert max(holders, key=lambda o: (o.created_at, o.id)).id in ids_in_group


# -- which pending container --------------------------------------------------------------------

containers = st.lists(
    st.builds(ContainerRequest, name=st.sampled_from(["init", "main", "side"]),
              requests=st.fixed_dictionaries({R: st.integers(1, 2)})),
    min_size=1, max_size=3, unique_by=lambda c: c.name,
)
pods_st = st.lists(
    st.builds(lambda i, cs: PodRecord(node="n", uid=UIDS[i], namespace="default",
                                      name=f"p{i}", phase="Pending", state="live",
                                      containers=cs, resource_version="1", updated_at=0),
              st.integers(0, 3), containers),
    max_size=4, unique_by=lambda p: p.uid,
)
kubelet_st = st.none() | st.dictionaries(
    st.sampled_from([("default", f"p{i}") for i in range(4)]),
    st.dictionaries(st.sampled_from(["init", "main", "side"]),
                    st.sampled_from([frozenset(), frozenset({R})]), max_size=3),
    max_size=4,
)
claimed_st = st.sets(st.tuples(st.sampled_from(UIDS), st.sampled_from(["init", "main", "side"])),
                     max_size=4)


@given(pods_st, st.integers(1, 2), claimed_st, kubelet_st)
@settings(max_examples=400, deadline=None)
def test_the_candidates_are_unclaimed_first_containers_in_admission_order(
    pods: list[PodRecord], quantity: int, claimed: set[tuple[str, str]], kubelet
) -> None:
    found = decide.survivors(pods, R, quantity, claimed, kubelet)
    order = [p.uid for p in pods]
    assert [t.uid for t in found] == sorted((t.uid for t in found), key=order.index)
    assert len({t.uid for t in found}) == len(found)  # at most one container per Pod
    for t in found:
        pod = next(p for p in pods if p.uid == t.uid)
        asked = [c for c in pod.containers if c.requests.get(R) == quantity
                 and (pod.uid, c.name) not in claimed]
        assert (t.uid, t.container) not in claimed
        if kubelet is None:
            assert t.container == asked[0].name  # the first unclaimed one kubelet allocates
        else:
            listed = kubelet.get((t.namespace, t.name))
            assert listed is not None and R not in listed.get(t.container, frozenset())
    chosen = decide.chosen(found)
    assert (chosen is not None) == (len(found) == 1)  # several are never chosen from
    if chosen is not None:
        assert chosen == found[0]


def test_chosen_never_guesses() -> None:
    a, b = Target(UIDS[0], "default", "a", "main"), Target(UIDS[1], "default", "b", "main")
    assert decide.chosen([]) is None
    assert decide.chosen([a, b]) is None
    assert decide.chosen([a]) == a


# -- what follows a plan that wrote nothing -----------------------------------------------------

REMAINING = [-1.0, 0.0, 0.5]


@pytest.mark.parametrize(
    ("placed", "fresh", "room_failed", "attempt", "made_room_at", "remaining"),
    list(itertools.product([False, True], [False, True], [False, True], [1, 2, 3], [0, 1, 2],
                           REMAINING)),
)
def test_after_miss_every_case(placed: bool, fresh: bool, room_failed: bool, attempt: int,
                               made_room_at: int, remaining: float) -> None:
    step = decide.after_miss(placed=placed, fresh=fresh, attempt=attempt,
                            made_room_at=made_room_at, remaining=remaining,
                            room_failed=room_failed)
    if not placed and not fresh:
        expected = decide.Step.READ_FRESH  # a plan on the views is checked on a fresh read
    elif not placed and not room_failed and remaining > 0 and made_room_at != attempt - 1:
        expected = decide.Step.MAKE_ROOM
    elif remaining <= 0:
        expected = decide.Step.REFUSE
    elif placed:
        expected = decide.Step.PLAN_AGAIN
    else:
        expected = decide.Step.WAIT
    assert step is expected


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=30),
       st.floats(0.5, 60))
@settings(max_examples=300, deadline=None)
def test_room_is_never_made_twice_in_a_row_and_the_end_is_a_refusal(
    outcomes: list[tuple[bool, bool]], budget: float
) -> None:
    """Driven as the shell drives it (fresh reads; `outcomes`: whether the plan found spots, and
    whether room could be made): room is asked for at most every other miss, and a deadline
    that has come always refuses."""
    made_at = attempt = 0
    made: list[int] = []  # the attempts after which room was made
    for step_number, (placed, room_made) in enumerate(outcomes, 1):
        remaining = budget - step_number
        step = decide.after_miss(placed=placed, fresh=True, attempt=attempt + 1,
                                made_room_at=made_at, remaining=remaining)
        attempt += 1
        if step is decide.Step.MAKE_ROOM:
            assert attempt - 1 not in made  # never right after room was made
            assert not placed and remaining > 0
            if room_made:
                made.append(attempt)
                made_at = attempt
                continue
            step = decide.after_miss(placed=False, fresh=True, attempt=attempt,
                                    made_room_at=made_at, remaining=remaining, room_failed=True)
        assert step is not decide.Step.MAKE_ROOM
        if remaining <= 0:
            assert step is decide.Step.REFUSE
            break
        assert step is (decide.Step.PLAN_AGAIN if placed else decide.Step.WAIT)


def test_the_room_wait_stays_under_its_cap() -> None:
    assert all(0 < decide.ROOM_WAIT(n) <= 4.0 for n in range(1, 20))


# -- which_pod: the one decision the shell asks until it says RESUME or SERVE ------------------

holder_st = st.none() | st.builds(decide.HolderSeen, dead=st.booleans(),
                                  being_admitted=st.booleans(),
                                  kubelet=st.sampled_from(list(VIEWS.values())))
looked_st = st.none() | st.builds(
    decide.Looked, answered=st.booleans(), pods=pods_st.map(tuple), kubelet=kubelet_st,
    problem=st.sampled_from(["", "the watcher's pods.pending failed: timeout"]),
).filter(lambda lk: lk.answered or lk.problem)
gathered_st = st.builds(
    decide.Gathered, claims=claims_st.map(tuple), fresh=st.booleans(), holder=holder_st,
    looked=looked_st, confirmed=st.none() | st.frozensets(st.sampled_from(UIDS), max_size=4),
)
asked_st = st.builds(decide.Asked, resource=st.just(R),
                     ids=st.lists(tokens, min_size=1, max_size=2, unique=True).map(tuple),
                     serving=st.frozensets(st.tuples(st.sampled_from(UIDS),
                                                     st.sampled_from(["init", "main", "side"])),
                                           max_size=2))


@given(asked_st, gathered_st)
@settings(max_examples=1500, deadline=None)
def test_which_pod_resumes_only_kubelets_retry_and_serves_only_one_unclaimed_container(
    asked: decide.Asked, known: decide.Gathered
) -> None:
    answer = decide.which_pod(asked, known)
    group = decide.existing(known.claims, R, asked.ids)
    # Tokens some claim carries are never judged on the views, nor without asking.
    if group and not known.fresh:
        assert answer.next is decide.Next.READ_FRESH
        return
    if group and known.holder is None:
        assert answer.next is decide.Next.JUDGE and list(answer.group) == group
        return
    if answer.next is decide.Next.RESUME:
        # Only the container that holds the IDs, asking again while kubelet admits it.
        assert group and list(answer.group) == group and known.holder is not None
        assert not known.holder.dead and known.holder.being_admitted
        assert decide.admitting(known.holder.kubelet, group[0])
        return
    if group:
        assert known.holder is not None
        said = decide.holder(group[0], dead=known.holder.dead,
                             being_admitted=known.holder.being_admitted,
                             kubelet=known.holder.kubelet)
        assert said is not Holder.RETRY
        assert (answer.handed_on is not None) == (said is Holder.HANDED_ON)
    else:
        assert answer.handed_on is None
    claimed = {(c.pod_uid, c.container) for c in known.claims if c.resource == R}
    if answer.next is decide.Next.SERVE:
        target = answer.target
        assert target is not None and known.looked is not None and known.looked.answered
        # Never a container that holds a claim of the resource or another Allocate is serving.
        assert (target.uid, target.container) not in claimed | asked.serving
        found = decide.survivors(known.looked.pods, R, len(asked.ids), claimed | asked.serving,
                                 known.looked.kubelet)
        left = found if len(found) < 2 else [t for t in found
                                             if known.confirmed and t.uid in known.confirmed]
        assert left == [target]  # the one left, never a pick among several
    elif answer.next is decide.Next.CONFIRM:
        assert known.confirmed is None and len(answer.candidates) > 1
    else:
        assert answer.next is decide.Next.LOOK
        assert answer.target is None
        assert known.looked is None or known.looked.problem or len(answer.candidates) != 1


def test_which_pod_walks_a_new_allocation_from_the_claims_to_the_container() -> None:
    """The shell's loop, played by hand: no claim carries the IDs, so look; two Pods are pending
    and kubelet cannot say which it admits, so confirm; one is no longer being admitted."""
    pods = tuple(PodRecord(node="n", uid=UIDS[i], namespace="default", name=f"p{i}",
                           phase="Pending", state="live",
                           containers=[ContainerRequest(name="main", requests={R: 1})],
                           resource_version="1", updated_at=0) for i in range(2))
    asked = decide.Asked(R, ("t0",))
    known = decide.Gathered(claims=(), fresh=False)
    assert decide.which_pod(asked, known).next is decide.Next.LOOK
    known = decide.Gathered((), False, looked=decide.Looked(answered=True, pods=pods))
    answer = decide.which_pod(asked, known)
    assert answer.next is decide.Next.CONFIRM
    assert [t.uid for t in answer.candidates] == UIDS[:2]
    known = decide.Gathered((), False, looked=known.looked, confirmed=frozenset({UIDS[1]}))
    answer = decide.which_pod(asked, known)
    assert answer.next is decide.Next.SERVE
    assert answer.target == Target(UIDS[1], "default", "p1", "main")
