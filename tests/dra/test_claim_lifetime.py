"""A DRA partition lives as long as its ResourceClaim's use on the node, never as long as the
first Pod of `reservedFor` (DESIGN.md section 11): the pure decisions of both sides."""

from __future__ import annotations

import msgspec
import pytest

from partkeeper.dra import DRIVER
from schemas import Claim
from services.allocator.dra.ends import ending
from services.reclaimer.decide import Sighting, Step, decide
from tests_support import make_claim

NODE = "node-a"
DEVICE = "gpu-0-mig-1g10gb-0"


def dra_claim(*, unprepared_at: float = 0.0, state: str = "active") -> Claim:
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
def test_reclaimer_never_releases_a_dra_claim_on_its_first_pods_end(pod: str) -> None:
    seen = Sighting(listed=True, present=None)
    shared = decide(dra_claim(), Sighting(listed=False), pod, 100.0, create_timeout=30)
    assert shared.step is Step.KEEP, "the ResourceClaim may still be used by another Pod"
    plain = decide(make_claim("c", 0, 1, state="active"), seen, pod, 100.0, create_timeout=30)
    assert plain.step is Step.RELEASE
