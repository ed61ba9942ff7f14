"""`partkeeper_partition_info`'s label sets (partkeeper/telemetry/partitions.py), a pure function
of claims and instances, and the gauge shell that keeps no stale series."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from partkeeper.drivers import Instance
from partkeeper.telemetry import metrics
from partkeeper.telemetry.partitions import LABELS, PartitionInfo, Series, User, series
from schemas import Claim, LiveInstance
from schemas.codec import decode
from schemas.documents import CardClaims
from schemas.events import ClaimState
from tests_support import UID

CARDS = {0: "GPU-aaaaaaaa-0000-0000-0000-000000000000",
         1: "GPU-bbbbbbbb-1111-1111-1111-111111111111"}
MIG = "MIG-11111111-2222-3333-4444-555555555555"


def inst(card: int = 0, gi: int = 9, ci: int = 0, uuid: str = MIG) -> Instance:
    return Instance(card=card, profile="1g.10gb", start=6, size=1, gi_id=gi, ci_id=ci, uuid=uuid)


def claim(state: ClaimState = "active", *, card: int = 0, uuid: str = MIG, kind: str = "partition",
          recorded: bool = True, rc_uid: str = "", **fields: str) -> Claim:
    return Claim(
        id=f"c-{uuid}", kind=kind, state=state, pod_uid=UID,  # type: ignore[arg-type]
        namespace=fields.get("namespace", "ml"), name=fields.get("name", "train-0"),
        container=fields.get("container", "main"), resource="nvidia.com/mig-1g.10gb",
        device_ids=["t-0"], card=card, profile="1g.10gb", start=6, size=1,
        instance=LiveInstance(gi_id=9, ci_id=0, uuid=uuid) if recorded else None,
        created_at=0, updated_at=0, resource_claim_uid=rc_uid,
        resource_claim="ml/shared" if rc_uid else "",
    )


def test_an_active_partition_names_its_device_and_its_pod() -> None:
    [s] = series([claim()], {0: (inst(),)}, CARDS)
    assert s == Series(uuid=MIG, gpu_instance_id="9", compute_instance_id="0",
                       card_uuid=CARDS[0], profile="1g.10gb", pod="train-0", namespace="ml",
                       container="main")


@pytest.mark.parametrize(("state", "shown"), [
    ("creating", False),  # it may never exist: the driver has not been asked, or answered
    ("active", True),
    ("releasing", True),  # the Pod is gone but the partition still exists: DCGM still sees it
])
def test_a_series_lives_while_the_partition_is_claimed_and_exists(
        state: ClaimState, shown: bool) -> None:
    assert bool(series([claim(state)], {0: (inst(),)}, CARDS)) is shown


def test_no_series_for_an_instance_the_driver_no_longer_lists() -> None:
    """Destroyed (the claim's removal still in flight), removed by hand, or by a reboot."""
    assert series([claim()], {0: ()}, CARDS) == frozenset()
    assert series([claim("releasing")], {0: ()}, CARDS) == frozenset()
    # Another instance at the slot (a successor, the same placement) is not this claim's.
    assert series([claim()], {0: (inst(uuid="MIG-other"),)}, CARDS) == frozenset()


def test_a_lost_card_concludes_nothing_from_listing_nothing() -> None:
    [s] = series([claim()], {0: ()}, CARDS, lost=frozenset({0}))
    assert (s.uuid, s.gpu_instance_id, s.compute_instance_id) == (MIG, "9", "0")


def test_ids_come_from_the_driver_as_it_lists_them() -> None:
    [s] = series([claim()], {0: (inst(gi=3, ci=1),)}, CARDS)
    assert (s.gpu_instance_id, s.compute_instance_id) == ("3", "1")


def test_slices_and_foreign_instances_have_no_series() -> None:
    assert series([claim(kind="slice", recorded=False)], {1: ()}, CARDS) == frozenset()
    foreign = inst(uuid="MIG-foreign")
    assert series([], {0: (foreign,)}, CARDS) == frozenset()


def test_the_card_uuid_is_the_claims_card() -> None:
    [s] = series([claim(card=1)], {1: (inst(card=1),)}, CARDS)
    assert s.card_uuid == CARDS[1]


def test_dra_without_known_users_names_the_prepared_pod_and_no_container() -> None:
    """The claim document's `container` holds the ResourceClaim's request in DRA mode."""
    [s] = series([claim(rc_uid="rc-1", container="gpu")], {0: (inst(),)}, CARDS)
    assert (s.namespace, s.pod, s.container) == ("ml", "train-0", "")


def test_a_shared_resource_claim_has_one_series_per_pod_and_container() -> None:
    users = {"rc-1": [User("ml", "a", "main"), User("ml", "b", "main"), User("ml", "b", "side"),
                      User("ml", "a", "main")]}
    found = series([claim(rc_uid="rc-1")], {0: (inst(),)}, CARDS, users=users)
    assert sorted((s.pod, s.container) for s in found) == [("a", "main"), ("b", "main"),
                                                           ("b", "side")]
    assert {s.uuid for s in found} == {MIG}


def test_an_earlier_claims_document_still_reads_and_shows() -> None:
    """A card document as an earlier version wrote it (no DRA fields, no outbox)."""
    raw = msgspec.json.encode({
        "type": "CardClaims", "v": 1, "node": "n1", "card": 0, "claims": {"c1": {
            "id": "c1", "state": "active", "pod_uid": UID, "namespace": "ml", "name": "train-0",
            "container": "main", "resource": "nvidia.com/mig-1g.10gb", "device_ids": ["t-0"],
            "card": 0, "profile": "1g.10gb", "start": 6, "size": 1,
            "instance": {"gi_id": 9, "ci_id": 0, "uuid": MIG},
            "created_at": 1.0, "updated_at": 2.0}}})
    doc = decode(raw, CardClaims)
    [s] = series(doc.claims.values(), {0: (inst(),)}, CARDS)
    assert (s.pod, s.container, s.uuid) == ("train-0", "main", MIG)


def test_the_gauge_declares_the_labels_in_the_contracts_order() -> None:
    assert tuple(metrics.PARTITION_INFO._labelnames) == LABELS == (
        "uuid", "gpu_instance_id", "compute_instance_id", "card_uuid", "profile", "pod",
        "namespace", "container")


def _exposed(registry: CollectorRegistry) -> set[tuple[tuple[str, str], ...]]:
    from prometheus_client import generate_latest
    text = generate_latest(registry).decode()
    return {tuple(sorted(s.labels.items())) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "t_partition_info" and s.value == 1}


def test_the_shell_sets_new_series_and_removes_gone_ones() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("t_partition_info", "test", list(LABELS), registry=registry)
    info = PartitionInfo(gauge)
    one = series([claim()], {0: (inst(),)}, CARDS)
    two = series([claim(uuid="MIG-2", card=1)], {1: (inst(card=1, uuid="MIG-2"),)}, CARDS)
    info.show(one | two)
    assert len(_exposed(registry)) == 2
    info.show(two)
    [left] = _exposed(registry)
    assert dict(left)["uuid"] == "MIG-2"
    info.show(frozenset())
    assert _exposed(registry) == set()
