"""The demo's summary: percentiles and the verdict, from recorded Pods (pure)."""

from __future__ import annotations

import pytest

from partkeeper.status import limiter_line
from partkeeper_sim.stack.demo import BusyResult, Outcome
from partkeeper_sim.stack.observe import PodTrack
from partkeeper_sim.stack.summary import (
    admission_latencies,
    describe,
    lines,
    percentile,
    reclaim_latencies,
)


@pytest.mark.parametrize(
    ("values", "pct", "expected"),
    [
        ([5.0], 50, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 90, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 75, 3.0),
        ([float(i) for i in range(1, 101)], 99, 99.0),
        ([float(i) for i in range(1, 101)], 100, 100.0),
    ],
)
def test_nearest_rank_percentile(values: list[float], pct: float, expected: float) -> None:
    assert percentile(values, pct) == expected


def test_no_values_is_said_not_invented() -> None:
    assert describe([]) == "n=0"
    with pytest.raises(ValueError):
        percentile([], 50)


def pod(name: str, *, kind: str = "partition", refused: str = "", busy: bool = False) -> PodTrack:
    track = PodTrack(name, "nvidia.com/mig-1g.10gb", kind, created=10.0, uid=name)
    if refused:
        track.refused = refused
        return track
    track.running, track.deleted, track.reclaimed = 10.5, 20.0, 20.25
    if busy:
        track.busy_released, track.reclaimed = 22.0, 22.1
    return track


def test_latencies_leave_out_the_busy_partition_and_slices() -> None:
    pods = [pod("a"), pod("b", busy=True), pod("c", kind="slice")]
    assert admission_latencies(pods) == [0.5, 0.5, 0.5]
    assert reclaim_latencies(pods) == [0.25]


def test_summary_passes_only_without_refusal_leak_or_error() -> None:
    refill = pod("c")
    refill.refill_of = "a"
    good = Outcome([pod("a"), pod("b", busy=True), refill], 1,
                   BusyResult("b", "MIG-x", 2, 1.5, 0.1), [], None, 3.0)
    text = "\n".join(lines(good))
    assert "refills created the moment their predecessor was deleted: 1, admitted 1" in text
    assert good.passed
    assert "refused 0" in text and "leaks: none" in text and "result: PASS" in text
    assert "foreign instances seen 1" in text and "destroy refused 2x" in text

    refused = Outcome([pod("a"), pod("r", refused="OutOfnvidia.com/mig-1g.10gb: no room")], 0,
                      None, [], None, 3.0)
    text = "\n".join(lines(refused))
    assert not refused.passed and "refused 1" in text and "result: FAIL" in text
    assert "r (nvidia.com/mig-1g.10gb): OutOfnvidia.com/mig-1g.10gb: no room" in text

    leaked = Outcome([pod("a")], 0, None, ["instance MIG-y left on the cards"], None, 3.0)
    assert not leaked.passed and "leaks: instance MIG-y" in "\n".join(lines(leaked))


def test_summary_says_whether_slices_are_enforced() -> None:
    said = Outcome([pod("a")], 0, None, [], None, 1.0, limiter_line(
        {"name": "none", "enforced": False, "dir": "", "missing": []}))
    assert "  slices NOT enforced: no slice limiter (PK_SLICE_LIMITER=none)" in "\n".join(
        lines(said))
    enforced = limiter_line({"name": "hami-core", "enforced": True, "dir": "/usr/local/vgpu",
                             "missing": []})
    assert enforced == "slices enforced by hami-core (files in /usr/local/vgpu)"
    assert "unknown" in limiter_line(None)
