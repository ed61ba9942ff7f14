"""Which Kubernetes Event each audit-log entry becomes, and its name: a pure table."""

from __future__ import annotations

import re

import pytest

from schemas import ForeignFound, ForeignGone, PartitionEvent, WorkdirCollected
from services.watcher.kube_events import (
    BadTarget,
    PodRef,
    describe,
    event_name,
    named_pod,
)
from tests_support.entries import MIG, UID, card_unhealthy, claim, destroy_failed, refused

TABLE: list[tuple[str, PartitionEvent, tuple[str, str, list[str]] | None]] = [
    ("creating is not worth an Event", claim("creating", instance_uuid=None), None),
    ("active partition", claim("active"), ("PartitionAllocated", "Normal",
        ["MIG partition 1g.10gb", "card 1", "placement 2+2", MIG, "container main", "c1"])),
    ("active slice", claim("active", profile="sliced", start=3, size=1, instance_uuid=None),
        ("PartitionAllocated", "Normal", ["logical slice 3 on card 1", "container main"])),
    ("releasing is not worth an Event", claim("releasing"), None),
    ("removed after the instance was destroyed",
        claim("removed", reason="instance destroyed or confirmed absent"),
        ("PartitionReclaimed", "Normal",
         ["Reclaimed MIG partition 1g.10gb", MIG, "instance destroyed or confirmed absent"])),
    ("removed without an instance is an undo, not a reclaim",
        claim("removed", instance_uuid=None, reason="placement lost to another writer"), None),
    ("destroy blocked", destroy_failed(), ("ReclaimBlocked", "Warning",
        ["Cannot destroy MIG partition", MIG, "card 1", "in use after 3 attempt(s)",
         "a process holds the instance"])),
    ("destroy of a lost card's partition: abandoned, not retried",
        destroy_failed(reason="card_lost", message="GPU is lost"), ("ReclaimBlocked", "Warning",
        ["card 1", "the card is lost", "3 attempt(s)", "the claim is abandoned"])),
    ("a failed card tells the Pod on it", card_unhealthy(), ("PartitionCardUnhealthy",
        "Warning", ["Card 1", "failed", "XID 48", "double-bit ECC", "claim c1"])),
    ("a failed partition tells its own Pod", card_unhealthy(scope="instance", xid=94,
        cause="xid-94", meaning="XID 94: contained ECC error"), ("PartitionCardUnhealthy",
        "Warning", [f"Its MIG partition {MIG} on card 1 failed", "XID 94"])),
    ("a lost card", card_unhealthy(cause="lost", xid=79, meaning="the card stopped answering"),
        ("PartitionCardUnhealthy", "Warning", ["XID 79", "stopped answering"])),
    ("refusal naming its Pod", refused(), ("AllocateRefused", "Warning",
        ["Allocate of 2 nvidia.com/mig-1g.10gb refused",
         "no 1g.10gb placement is free on any card"])),
    ("refusal of an unidentified Pod has nowhere to go",
        refused(pod_uid="", namespace="", name=""), None),
    ("foreign instance", ForeignFound(node="n", at=1.0, card=0, instance_uuid=MIG,
                                      profile="1g.10gb", start=0, size=2), None),
    ("foreign gone", ForeignGone(node="n", at=1.0, card=0, instance_uuid=MIG, reaped=False),
        None),
    ("workdir collected", WorkdirCollected(node="n", at=1.0, pod_uid=UID), None),
]


@pytest.mark.parametrize(("event", "expected"), [(e, x) for _, e, x in TABLE],
                         ids=[name for name, _, _ in TABLE])
def test_describe(event: PartitionEvent, expected: tuple[str, str, list[str]] | None) -> None:
    note = describe(event)
    if expected is None:
        assert note is None
        return
    assert note is not None
    reason, kind, fragments = expected
    assert (note.reason, note.type) == (reason, kind)
    for fragment in fragments:
        assert fragment in note.message


def test_the_fact_not_the_delivery_names_the_event() -> None:
    first, again = describe(claim("active", at=1.0)), describe(claim("active", at=99.0))
    assert first is not None and again is not None and first.fact == again.fact
    facts = {
        n.fact for n in (describe(claim("active")), describe(claim("removed")),
                         describe(destroy_failed()), describe(destroy_failed(attempts=4)),
                         describe(refused()), describe(refused(reason="another sentence")))
        if n is not None
    }
    assert len(facts) == 6
    one = describe(refused(device_ids=["t1", "t2"]))
    other = describe(refused(device_ids=["t2", "t1"]))
    assert one is not None and other is not None and one.fact == other.fact


@pytest.mark.parametrize("pod_name", ["train-0", "a" * 253, "a" * 235 + ".-b" + "c" * 20])
def test_event_names_are_valid_and_stable(pod_name: str) -> None:
    name = event_name(pod_name, "ClaimChanged/c1/active")
    assert name == event_name(pod_name, "ClaimChanged/c1/active")
    assert name != event_name(pod_name, "ClaimChanged/c1/removed")
    assert len(name) <= 253
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                        name)


def test_named_pod_takes_the_names_the_entry_carries() -> None:
    assert named_pod(claim("active")) == PodRef("ml", "train-0", UID)
    assert named_pod(destroy_failed()) is None  # the view supplies the names
    assert named_pod(refused(namespace="", name="")) is None


@pytest.mark.parametrize("event", [
    claim("active", pod_uid="../../etc"),
    claim("active", pod_uid=UID.upper()),
    claim("active", pod_uid=""),
    claim("active", namespace="Bad_NS"),
    claim("active", name="../x"),
    destroy_failed(pod_uid="*"),
], ids=["path", "upper-case", "empty", "namespace", "name", "wildcard"])
def test_a_pod_no_object_can_be_is_refused(event: PartitionEvent) -> None:
    with pytest.raises(BadTarget):
        named_pod(event)
