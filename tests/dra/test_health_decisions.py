"""The resource-health stream's decision (services/allocator/dra/health.py): a pure function from
the node's devices and card health to the complete device list, and its per-version message."""

from __future__ import annotations

import pytest

from partkeeper.dra import devices
from partkeeper.drivers import Card
from partkeeper.drivers.cardhealth import (
    NO_INSTANCE,
    CardEvent,
    CardHealth,
    EventKind,
    classify,
    policy,
)
from partkeeper.kubelet import dra_health_v1_pb2, dra_health_v1alpha1_pb2, dra_health_v1beta1_pb2
from schemas import Claim
from schemas.documents import LiveInstance
from services.allocator.dra.health import MESSAGE_LIMIT, DeviceState, device_states, response

CARDS = (Card(0, "GPU-0", "H100-80GB", "partition", 81920),
         Card(1, "GPU-1", "H100-80GB", "partition", 81920),
         Card(2, "GPU-2", "A100-40GB", "sliced", 40960))
RULES = policy()


def fault(card: int, kind: EventKind = EventKind.XID, xid: int = 0, gi: int = NO_INSTANCE,
          ci: int = NO_INSTANCE) -> CardHealth:
    return CardHealth().apply(classify(CardEvent(card, kind, xid, gi, ci), RULES))


def claim(card: int, profile: str, start: int, gi: int, ci: int) -> Claim:
    return Claim(id=f"c-{card}-{start}", state="active", pod_uid="u", namespace="ns", name="p",
                 container="main", resource="r", device_ids=[], card=card, profile=profile,
                 start=start, size=1, instance=LiveInstance(gi_id=gi, ci_id=ci, uuid="MIG-x"),
                 created_at=0.0, updated_at=0.0)


def by_name(states: tuple[DeviceState, ...]) -> dict[str, DeviceState]:
    return {s.device: s for s in states}


def test_the_list_is_every_published_device_of_every_partition_card_healthy() -> None:
    states = device_states("node-a", CARDS, CardHealth(), (), ())
    assert [s.device for s in states] == [d.name for d in devices.all_devices(CARDS)]
    assert {s.pool for s in states} == {"node-a"}
    assert {s.health for s in states} == {"HEALTHY"}
    assert not any(s.device.startswith("gpu-2-") for s in states)  # sliced: no DRA devices


@pytest.mark.parametrize(("xid", "words"), [(79, "XID 79"), (48, "XID 48")])
def test_a_fatal_xid_makes_every_device_of_its_card_unhealthy_naming_card_and_xid(
    xid: int, words: str
) -> None:
    states = by_name(device_states("n", CARDS, fault(1, xid=xid), (), ()))
    failed = [s for s in states.values() if s.device.startswith("gpu-1-")]
    assert failed and {s.health for s in failed} == {"UNHEALTHY"}
    assert all("card 1" in s.message and words in s.message for s in failed)
    assert {s.health for s in states.values() if s.device.startswith("gpu-0-")} == {"HEALTHY"}


def test_an_ignored_xid_changes_nothing() -> None:
    assert fault(0, xid=13) == CardHealth()  # XID 13: an application's error
    assert {s.health for s in device_states("n", CARDS, fault(0, xid=13), (), ())} == {
        "HEALTHY"}


def test_ecc_and_lost_cards_are_unhealthy() -> None:
    ecc = by_name(device_states("n", CARDS, fault(0, EventKind.ECC_UNCORRECTABLE), (), ()))
    assert ecc["gpu-0-mig-7g80gb-0"].health == "UNHEALTHY"
    assert "ECC" in ecc["gpu-0-mig-7g80gb-0"].message
    fell = by_name(device_states("n", CARDS, fault(1, EventKind.LOST, xid=79), (), ()))
    assert fell["gpu-1-mig-7g80gb-0"].health == "UNHEALTHY"
    assert "card 1" in fell["gpu-1-mig-7g80gb-0"].message
    assert "XID 79" in fell["gpu-1-mig-7g80gb-0"].message
    lost = by_name(device_states("n", CARDS, CardHealth(), {1}, ()))
    assert lost["gpu-1-mig-1g10gb-3"].health == "UNHEALTHY"
    assert "card 1 is lost" in lost["gpu-1-mig-1g10gb-3"].message


def test_recovery_makes_the_card_healthy_again() -> None:
    failed = fault(1, xid=79)
    recovered = failed.apply(classify(CardEvent(1, EventKind.RECOVERED), RULES))
    assert {s.health for s in device_states("n", CARDS, recovered, (), ())} == {"HEALTHY"}


def test_an_instance_xid_fails_only_the_device_of_that_partition() -> None:
    health = fault(0, xid=94, gi=3, ci=0)
    claims = [claim(0, "1g.10gb", 6, 3, 0), claim(0, "1g.10gb", 5, 4, 0)]
    states = by_name(device_states("n", CARDS, health, (), claims))
    hit = states["gpu-0-mig-1g10gb-6"]
    assert hit.health == "UNHEALTHY" and "GPU instance 3" in hit.message
    assert "XID 94" in hit.message
    others = [s for name, s in states.items() if name != "gpu-0-mig-1g10gb-6"]
    assert {s.health for s in others} == {"HEALTHY"}


@pytest.mark.parametrize("pb2", [dra_health_v1_pb2, dra_health_v1beta1_pb2])
def test_v1_and_v1beta1_responses_carry_the_message(pb2) -> None:
    long = DeviceState("n", "gpu-0-mig-1g10gb-0", "UNHEALTHY", "x" * 2000)
    answer = response(pb2, [long, DeviceState("n", "gpu-0-mig-1g10gb-1", "HEALTHY")], 12.5)
    first, second = answer.devices
    assert (first.device.pool_name, first.device.device_name) == ("n", "gpu-0-mig-1g10gb-0")
    assert first.health == pb2.UNHEALTHY and second.health == pb2.HEALTHY
    assert len(first.message) == MESSAGE_LIMIT and first.last_updated_time == 12
    assert second.message == ""


def test_v1alpha1_responses_have_no_message_field() -> None:
    answer = response(dra_health_v1alpha1_pb2,
                      [DeviceState("n", "gpu-0-mig-1g10gb-0", "UNKNOWN", "why")], 1.0)
    (only,) = answer.devices
    assert only.health == dra_health_v1alpha1_pb2.UNKNOWN
    assert "message" not in dra_health_v1alpha1_pb2.DeviceHealth.DESCRIPTOR.fields_by_name


def test_a_card_listed_lost_at_start_without_its_model_is_left_out() -> None:
    unknown = (*CARDS[:1], Card(1, "", "", "partition", 0, None, "lost: sim"))
    states = device_states("n", unknown, CardHealth(), {1}, ())
    assert states and all(s.device.startswith("gpu-0-") for s in states)
