"""The GC's pure decision: what may be deleted, given (listing, pods.get answer, claims answer)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partkeeper.workdir import ContainerListing, Entry, PodListing
from partkeeper.workdir.scan import SlicedState
from schemas import ClaimsReply, PodsGetReply
from schemas.events import ClaimState
from schemas.pods import PodState
from services.gc.decide import Plan, candidates, decide
from tests_support import UID, make_claim

OTHER = "ffffffff-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
DESC = ("partition-MIG-1.json",)


def pod(*containers: ContainerListing, others: tuple[Entry, ...] = ()) -> PodListing:
    return PodListing(UID, "dir", containers=containers, others=others)


def c(name: str, *, descriptors: tuple[str, ...] = (), sliced: SlicedState = "absent",
      others: tuple[Entry, ...] = ()) -> ContainerListing:
    return ContainerListing(f"c-{name}", name, descriptors, sliced, others)


def said(state: PodState, uid: str = UID) -> PodsGetReply:
    return PodsGetReply(uid=uid, state=state, evidence="table")


def claims(*states: ClaimState, uid: str = UID) -> ClaimsReply:
    return ClaimsReply(claims=[make_claim(f"k{i}", i, 1, state=s, uid=uid)
                               for i, s in enumerate(states)])


NONE = ClaimsReply()
STRAY = Entry("notes.txt", "file")

# (name, listing, pods.get answer, claims answer, verdict, code, sliced, rmdirs, pod_rmdir)
TABLE = [
    ("absent", PodListing(UID, "absent"), said("gone"), NONE, "nothing", "no-directory",
     (), (), False),
    ("pod dir unsafe", PodListing(UID, "unsafe", "is a symbolic link"), said("gone"), NONE,
     "refuse", "unsafe", (), (), False),
    ("descriptor only: never ours", pod(c("main", descriptors=DESC)), said("gone"), NONE,
     "nothing", "nothing-ours", (), (), False),
    ("unmarked sliced: not ours", pod(c("main", sliced="unmarked")), said("gone"), NONE,
     "nothing", "nothing-ours", (), (), False),
    ("foreign mark: not ours", pod(c("main", sliced="bad-mark")), said("gone"), NONE,
     "nothing", "nothing-ours", (), (), False),
    ("sliced is a link: not ours", pod(c("main", sliced="unsafe")), said("gone"), NONE,
     "nothing", "nothing-ours", (), (), False),
    ("live Pod", pod(c("main", descriptors=DESC, sliced="owned")), said("live"), NONE,
     "refuse", "live", (), (), False),
    ("unknown Pod (not yet seen)", pod(c("main", sliced="owned")), said("unknown"), NONE,
     "refuse", "unknown", (), (), False),
    ("pods.get unanswered", pod(c("main", sliced="owned")), None, NONE,
     "defer", "pods-unanswered", (), (), False),
    ("pods.get about another Pod", pod(c("main", sliced="owned")), said("gone", OTHER), NONE,
     "defer", "pods-unanswered", (), (), False),
    ("claims.query unanswered", pod(c("main", sliced="owned")), said("gone"), None,
     "defer", "claims-unanswered", (), (), False),
    ("claim still creating", pod(c("main", sliced="owned")), said("gone"), claims("creating"),
     "defer", "creating", (), (), False),
    ("another Pod's creating claim", pod(c("main", sliced="owned")), said("gone"),
     claims("creating", uid=OTHER), "collect", "confirmed", ("main",), ("c-main",), True),
    ("gone, descriptor stays", pod(c("main", descriptors=DESC, sliced="owned")), said("gone"),
     NONE, "collect", "confirmed", ("main",), (), False),
    ("finished, slice only", pod(c("main", sliced="owned")), said("finished"),
     claims("active", "releasing"), "collect", "confirmed", ("main",), ("c-main",), True),
    ("mixed containers", pod(c("a", sliced="owned"), c("b", sliced="unmarked")), said("gone"),
     NONE, "collect", "confirmed", ("a",), ("c-a",), False),
    ("stray file keeps its container", pod(c("main", sliced="owned", others=(STRAY,))),
     said("gone"), NONE, "collect", "confirmed", ("main",), (), False),
    ("stray entry keeps the Pod dir", pod(c("main", sliced="owned"), others=(STRAY,)),
     said("gone"), NONE, "collect", "confirmed", ("main",), ("c-main",), False),
    ("empty Pod dir, gone", pod(), said("gone"), NONE, "collect", "confirmed", (), (), True),
    ("empty Pod dir, live", pod(), said("live"), NONE, "refuse", "live", (), (), False),
    ("empty container, gone", pod(c("main"), c("x", descriptors=DESC)), said("gone"), NONE,
     "collect", "confirmed", (), ("c-main",), False),
]


@pytest.mark.parametrize(
    ("listing", "pod_answer", "claims_answer", "verdict", "code", "sliced", "rmdirs", "pod_rmdir"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_decision_table(
    listing: PodListing, pod_answer: PodsGetReply | None, claims_answer: ClaimsReply | None,
    verdict: str, code: str, sliced: tuple[str, ...], rmdirs: tuple[str, ...], pod_rmdir: bool,
) -> None:
    plan = decide(listing, pod_answer, claims_answer)
    assert (plan.verdict, plan.code, plan.sliced, plan.rmdirs, plan.pod_rmdir) == (
        verdict, code, sliced, rmdirs, pod_rmdir
    )


def test_unrecognised_things_are_reported() -> None:
    listing = pod(
        c("a", sliced="bad-mark", others=(Entry("x", "symlink"),)), others=(Entry("y", "mount"),)
    )
    plan = candidates(listing)
    assert set(plan.report) == {
        f"{UID}/y (mount)", f"{UID}/c-a/x (symlink)", f"{UID}/c-a/sliced (bad-mark)"
    }


# --- properties over any listing and any answers ------------------------------------------------

entries = st.builds(Entry, st.sampled_from(["f", "g"]),
                    st.sampled_from(["dir", "file", "symlink", "mount", "other"]))
containers = st.builds(
    lambda name, desc, sliced, others: c(name, descriptors=desc, sliced=sliced, others=others),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from([(), DESC]),
    st.sampled_from(["absent", "owned", "unmarked", "bad-mark", "unsafe"]),
    st.lists(entries, max_size=2).map(tuple),
)
listings = st.one_of(
    st.just(PodListing(UID, "absent")),
    st.just(PodListing(UID, "unsafe", "x")),
    st.builds(
        lambda cs, others: PodListing(UID, "dir", containers=tuple(cs), others=tuple(others)),
        st.lists(containers, max_size=3, unique_by=lambda x: x.entry),
        st.lists(entries, max_size=2),
    ),
)
pod_answers = st.one_of(
    st.none(),
    st.builds(said, st.sampled_from(["live", "finished", "gone", "unknown"]),
              st.sampled_from([UID, OTHER])),
)
claim_answers = st.one_of(
    st.none(),
    st.builds(
        lambda pairs: ClaimsReply(claims=[make_claim(f"k{i}", i, 1, state=s, uid=u)
                                          for i, (s, u) in enumerate(pairs)]),
        st.lists(st.tuples(st.sampled_from(["creating", "active", "releasing"]),
                           st.sampled_from([UID, OTHER])), max_size=3),
    ),
)


@given(listings, pod_answers, claim_answers)
def test_nothing_is_deleted_without_both_answers_and_a_confirmed_end(
    listing: PodListing, pod_answer: PodsGetReply | None, claims_answer: ClaimsReply | None
) -> None:
    plan = decide(listing, pod_answer, claims_answer)
    deletes = bool(plan.sliced or plan.rmdirs or plan.pod_rmdir)
    assert deletes == (plan.verdict == "collect")
    if plan.verdict != "collect":
        return
    assert pod_answer is not None and pod_answer.uid == UID
    assert pod_answer.state in ("gone", "finished")
    assert claims_answer is not None
    assert not any(k.pod_uid == UID and k.state == "creating" for k in claims_answer.claims)
    _assert_only_owned(listing, plan)


def _assert_only_owned(listing: PodListing, plan: Plan) -> None:
    by_entry = {x.entry: x for x in listing.containers}
    assert set(plan.sliced) <= {x.container for x in listing.containers if x.sliced == "owned"}
    for entry in plan.rmdirs:
        x = by_entry[entry]
        assert not x.descriptors and not x.others and x.sliced in ("absent", "owned")
    if plan.pod_rmdir:
        assert not listing.others and set(plan.rmdirs) == set(by_entry)
