"""Foreign-instance bookkeeping and the retry schedule: pure functions, tables and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partkeeper.drivers.base import Instance
from services.reclaimer import foreign
from services.reclaimer.tuning import Tuning, retry_delay


def inst(uuid: str, gi: int = 1, card: int = 0, start: int = 0) -> Instance:
    return Instance(card=card, profile="1g.5gb", start=start, size=1, gi_id=gi, ci_id=0,
                    uuid=uuid)


A, B, C = inst("MIG-a", 1), inst("MIG-b", 2, start=1), inst("MIG-c", 1, card=1)


def test_found_once_then_gone_once() -> None:
    first = foreign.diff({}, [A, B], now=1.0)
    assert [s.instance for s in first.found] == [A, B] and first.gone == []
    again = foreign.diff(first.known, [A, B], now=2.0)
    assert again.found == [] and again.gone == [] and again.known == first.known
    later = foreign.diff(again.known, [B, C], now=3.0)
    assert [s.instance for s in later.found] == [C]
    assert [s.instance for s in later.gone] == [A]
    assert later.known[foreign.key(B)].since == 1.0  # B's grace keeps counting


def test_a_reproduced_identity_with_a_new_shape_is_a_new_sighting() -> None:
    first = foreign.diff({}, [A], now=1.0)
    moved = inst("MIG-a", 1, start=3)
    nxt = foreign.diff(first.known, [moved], now=5.0)
    assert [s.instance for s in nxt.found] == [moved]
    assert [s.instance for s in nxt.gone] == [A]
    assert nxt.known[foreign.key(moved)].since == 5.0


@pytest.mark.parametrize(
    ("policy", "grace", "now", "expected"),
    [
        ("keep", 0.0, 100.0, []),
        ("reap", 10.0, 5.0, []),
        ("reap", 10.0, 11.0, ["MIG-a"]),
        ("reap", 10.0, 13.0, ["MIG-a", "MIG-b"]),
        ("reap", 0.0, 1.0, ["MIG-a"]),
    ],
)
def test_reapable_only_with_reap_after_grace(policy: str, grace: float, now: float,
                                             expected: list[str]) -> None:
    known = foreign.diff({}, [A], now=1.0).known
    known = foreign.diff(known, [A, B], now=3.0).known
    chosen = foreign.reapable(known, now, policy=policy, grace=grace)
    assert [s.instance.uuid for s in chosen] == expected


@given(st.lists(st.lists(st.sampled_from([A, B, C]), max_size=3), max_size=8))
def test_every_sighting_is_found_once_and_gone_at_most_once(passes) -> None:
    known: dict = {}
    found: list = []
    gone: list = []
    for t, current in enumerate(passes):
        change = foreign.diff(known, current, now=float(t))
        known = change.known
        found += [(foreign.key(s.instance), s.since) for s in change.found]
        gone += [(foreign.key(s.instance), s.since) for s in change.gone]
        assert set(known) == {foreign.key(i) for i in current}
    assert len(found) == len(set(found)) and len(gone) == len(set(gone))
    assert set(gone) <= set(found)
    assert set(found) - set(gone) == {(k, s.since) for k, s in known.items()}


@given(st.integers(1, 200))
def test_retry_delay_is_bounded_and_slows_after_the_threshold(failures: int) -> None:
    tuning = Tuning(destroy_threshold=5, fast_base=0.2, fast_cap=5, slow_base=10, slow_cap=60)
    delay = retry_delay(failures, tuning)
    if failures < tuning.destroy_threshold:
        assert 0 < delay <= tuning.fast_cap
    else:
        assert tuning.slow_base / 2 <= delay <= tuning.slow_cap
