"""The shared Pod-state predicates (partkeeper.podstate), one table each. That the allocator's
room plan and the reclaimer's reclaim.now use the same one is tested end to end in
tests/allocator/test_pod_matching.py."""

from __future__ import annotations

import msgspec
import pytest

from partkeeper.podstate import CREATE_TIMEOUT, being_admitted, is_dead, reclaimable_now
from schemas import Claim, PodRecord
from schemas.events import ClaimState
from tests_support import UID, make_claim

NOW = 10_000.0


@pytest.mark.parametrize(("state", "dead"), [("finished", True), ("gone", True), ("live", False),
                                             ("unknown", False), ("no-answer", False),
                                             (None, False)])
def test_dead_is_finished_or_gone(state, dead) -> None:
    assert is_dead(state) is dead


def pod(**fields: object) -> PodRecord:
    base = PodRecord(node="n", uid=UID, namespace="default", name="p", phase="Pending",
                     state="live", resource_version="1", updated_at=0)
    return msgspec.structs.replace(base, **fields)


@pytest.mark.parametrize(
    ("record", "admitted"),
    [
        pytest.param(pod(), True, id="live and Pending"),
        pytest.param(pod(phase="Running"), False, id="Running: its containers started"),
        pytest.param(pod(deleting=True), False, id="being deleted"),
        pytest.param(pod(phase="Failed", state="finished"), False, id="rejected"),
        pytest.param(None, False, id="not known to the watcher"),
    ],
)
def test_being_admitted(record, admitted) -> None:
    assert being_admitted(record) is admitted


def aged(state: ClaimState, age: float) -> Claim:
    claim = make_claim("c", 0, 1, state=state)
    return msgspec.structs.replace(claim, created_at=NOW - age, updated_at=NOW - age)


@pytest.mark.parametrize(
    ("claim", "pod_dead", "reclaimable"),
    [
        pytest.param(aged("releasing", 0), False, True, id="releasing: the intent is durable"),
        pytest.param(aged("active", 0), True, True, id="active of a dead Pod"),
        pytest.param(aged("active", 0), False, False, id="active of a live Pod"),
        pytest.param(aged("creating", CREATE_TIMEOUT + 1), True, True,
                     id="stale creating of a dead Pod: a crash's leftover"),
        pytest.param(aged("creating", 1), True, False,
                     id="young creating of a dead Pod: its Allocate may still create"),
        pytest.param(aged("creating", CREATE_TIMEOUT + 1), False, False,
                     id="stale creating of a live Pod: kubelet may retry"),
        # Deliberately a state no version writes (a corrupt or future document).
        pytest.param(aged("bogus", 0), True, False, id="unknown state"),  # type: ignore[arg-type]
    ],
)
def test_reclaimable_now(claim, pod_dead, reclaimable) -> None:
    assert reclaimable_now(claim, pod_dead=pod_dead, now=NOW) is reclaimable
