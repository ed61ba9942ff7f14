"""A DRA partition lives as long as its ResourceClaim's use on the node, never as long as the
first Pod of `reservedFor` (docs/contract.md section 11): the pure decisions of both sides."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from partkeeper.dra import DRIVER
from schemas import Claim
from schemas.events import ClaimState
from services.allocator.dra.ends import ending
from services.reclaimer.decide import PodVerdict, Sighting, Step, decide
from tests_support import make_claim

NODE = "node-a"
DEVICE = "gpu-0-mig-1g10gb-0"


def dra_claim(*, unprepared_at: float = 0.0, state: ClaimState = "active") -> Claim:
    claim = make_claim("c.dev", 0, 1, state=state)
    return msgspec.structs.replace(
        claim, device_ids=[DEVICE], resource_claim="default/c1", resource_claim_uid="rc-1",
        unprepared_at=unprepared_at)


def body(uid: str = "rc-1", pool: str = NODE, device: str = DEVICE, allocated: bool = True):
    status = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]}}} if allocated \
        else {}
    return {"metadata": {"uid": uid}, "status": status}


@pytest.mark.parametrize(("claim", "answer", "released"), [
    (dra_claim(), body(), False),
    (dra_claim(), body(allocated=False), False),  # deallocated but kubelet still prepared it
    (dra_claim(unprepared_at=1.0), body(), False),  # unprepared, a Pod may come back to it
    (dra_claim(unprepared_at=1.0), body(allocated=False), True),
    (dra_claim(unprepared_at=1.0), body(pool="node-b"), True),
    (dra_claim(unprepared_at=1.0), body(device="gpu-0-mig-1g10gb-1"), True),
    (dra_claim(), None, True),  # deleted: only once nothing is reserved for it
    (dra_claim(), body(uid="rc-2"), True),  # deleted and re-created under the same name
    (dra_claim(state="releasing"), None, False),  # already on its way
])
def test_ending(claim: Claim, answer, released: bool) -> None:
    assert (ending(claim, answer, NODE) is not None) is released


@pytest.mark.parametrize("pod", ["gone", "finished"])
def test_reclaimer_never_releases_a_dra_claim_on_its_first_pods_end(pod: PodVerdict) -> None:
    seen = Sighting(listed=True, present=None)
    shared = decide(dra_claim(), Sighting(listed=False), pod, 100.0, create_timeout=30)
    assert shared.step is Step.KEEP, "the ResourceClaim may still be used by another Pod"
    plain = decide(make_claim("c", 0, 1, state="active"), seen, pod, 100.0, create_timeout=30)
    assert plain.step is Step.RELEASE


class SharedClaim(RuleBasedStateMachine):
    """One ResourceClaim on this node, Pods joining and leaving it in any order, kubelet's
    bookkeeping (prepare once, unprepare after the last Pod) and the resourceclaim controller
    (deallocate, or delete, a claim reserved for nobody), with the allocator's `ending` asked
    after every step: it never lets the partition go while a Pod uses the claim, and does once
    the claim's use has ended."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: set[int] = set()
        self.next_pod = 0
        self.allocated = False
        self.deleted = False
        self.claim = dra_claim()
        self.released = False

    def _answer(self) -> dict | None:
        return None if self.deleted else body(allocated=self.allocated)

    @precondition(lambda self: not self.deleted and not self.released)
    @rule()
    def pod_joins(self) -> None:
        self.allocated = True  # the scheduler allocates it (again) to this node's device
        self.pods.add(self.next_pod)
        self.next_pod += 1
        if self.claim.unprepared_at:  # kubelet prepares it again; prepare clears the mark
            self.claim = msgspec.structs.replace(self.claim, unprepared_at=0.0)

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data())
    def pod_leaves(self, data) -> None:
        self.pods.discard(data.draw(st.sampled_from(sorted(self.pods))))
        if not self.pods:  # kubelet unprepares after the last Pod
            self.claim = msgspec.structs.replace(self.claim, unprepared_at=1.0)

    @precondition(lambda self: not self.pods and self.allocated and not self.deleted)
    @rule(delete=st.booleans())
    def controller_settles(self, delete: bool) -> None:
        if delete:
            self.deleted = True
        else:
            self.allocated = False

    @rule()
    def time_passes(self) -> None:
        """The allocator's next pass, with nothing else changed (always possible)."""

    @invariant()
    def only_an_ended_claim_goes(self) -> None:
        if self.released:
            return
        reason = ending(self.claim, self._answer(), NODE)
        if reason is not None:
            assert not self.pods, f"released under a running Pod: {reason}"
            self.released = True
        ended = not self.pods and self.claim.unprepared_at and not self.allocated
        if self.deleted or ended:
            assert reason is not None, "a claim whose use ended keeps its partition"


TestSharedClaim = SharedClaim.TestCase
