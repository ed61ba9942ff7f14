"""After a host reboot, in the allocator: where a claim the reboot left is re-made
(`core.remake.spot`, `plan`: its old placement when free, else the lowest legal one on its card)
and when an Allocate naming its device IDs is kubelet starting the Pod's container again
(`deviceplugin.decide.holder`)."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from partkeeper.drivers.base import Instance
from partkeeper.drivers.profiles import overlaps
from schemas import Claim
from services.allocator.core import remake
from services.allocator.deviceplugin import decide
from services.allocator.deviceplugin.decide import Holder, KubeletView
from tests_support import make_claim

TWO = [(0, 2), (2, 2), (4, 2), (6, 2)]  # 1g.20gb-like: size 2 at 0, 2, 4, 6


def lost(cid: str, start: int, size: int = 2, card: int = 0) -> Claim:
    c = make_claim(cid, start, size, state="active")
    return msgspec.structs.replace(c, card=card, rebooted=True)


def holding(cid: str, start: int, size: int = 2) -> Claim:
    return make_claim(cid, start, size, state="active")


def test_the_old_placement_when_free() -> None:
    c = lost("a", 4)
    assert remake.spot(c, TWO, [c, lost("b", 0)], [], frozenset()) == remake.Spot(0, 4, 2)


def test_else_the_lowest_free_legal_one_on_its_card() -> None:
    c = lost("a", 4)
    taken = [c, holding("new", 4), holding("n2", 0)]
    assert remake.spot(c, TWO, taken, [], frozenset()) == remake.Spot(0, 2, 2)
    carved = [Instance(0, "x", 2, 2, 3, 0, "MIG-carved")]  # a foreign one counts occupied
    assert remake.spot(c, TWO, taken, carved, frozenset()) == remake.Spot(0, 6, 2)


def test_none_on_a_full_or_failed_card() -> None:
    c = lost("a", 0)
    full = [c, *(holding(f"h{s}", s) for s, _ in TWO)]
    assert remake.spot(c, TWO, full, [], frozenset()) is None
    assert remake.spot(c, TWO, [c], [], frozenset({0})) is None


@given(st.lists(st.sampled_from([0, 2, 4, 6]), min_size=1, max_size=4, unique=True),
       st.lists(st.sampled_from([0, 2, 4, 6]), max_size=4, unique=True))
def test_a_plan_never_overlaps_what_holds_room_nor_itself(lost_at: list[int],
                                                          held_at: list[int]) -> None:
    group = [lost(f"l{s}", s) for s in lost_at]
    live = [holding(f"h{s}", s) for s in held_at]

    class Snap:
        claims = [*group, *live]
        all_instances: list[Instance] = []
        failed: frozenset[int] = frozenset()

    planned = remake.plan(group, {0: TWO}, Snap())  # type: ignore[arg-type]
    if isinstance(planned, str):
        assert len(lost_at) + len(held_at) > len(TWO)  # only when there is not room for all
        return
    spots = [s.range for _, s in planned] + [(c.start, c.size) for c in live]
    assert all(not overlaps(a, b) for a, b in itertools.combinations(spots, 2))
    for claim, at in planned:  # each keeps its old spot unless a live claim took it
        if claim.start not in held_at:
            assert at.start == claim.start


# -- the holder of the IDs after a reboot ------------------------------------------------------

R = "nvidia.com/mig-1g.10gb"
VIEWS: dict[str, KubeletView | None] = {
    "no answer": None,
    "Pod listed": {("default", "pod"): {"main": frozenset({R})}},
    "Pod not listed": {},
}


@pytest.mark.parametrize(("kind", "dead", "view"),
                         list(itertools.product(["rebooted", "re-made", "plain"], [False, True],
                                                VIEWS)))
def test_holder_after_a_reboot(kind: str, dead: bool, view: str) -> None:
    base = msgspec.structs.replace(make_claim("c1", 0, 1, state="active"), resource=R,
                                   device_ids=["t0"])
    c = {"rebooted": msgspec.structs.replace(base, rebooted=True),
         "re-made": msgspec.structs.replace(base, remakes=1),
         "plain": base}[kind]
    # The Pod is Running in the API server: kubelet is not admitting it, it is starting it again.
    said = decide.holder(c, dead=dead, being_admitted=False, kubelet=VIEWS[view])
    if dead:
        assert said is Holder.DEAD
    elif kind != "plain" and view != "Pod not listed":
        assert said is Holder.RETRY
    else:
        assert said is Holder.HANDED_ON
