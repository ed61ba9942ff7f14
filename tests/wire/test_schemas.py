"""The wire contract: round trips, strict decoding, and the subject-token encoding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import (
    CardClaims,
    Claim,
    PodEvent,
    PodGone,
    PodSeen,
    PodsGet,
    SchemaError,
    decode,
    encode,
    validate_pod_uid,
)
from schemas.names import (
    TokenError,
    claims_key,
    decode_token,
    encode_token,
    parts_subject,
    pods_subject,
)
from schemas.pods import InvalidPodUID

UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


def _seen() -> PodSeen:
    return PodSeen(
        node="n1", uid=UID, namespace="default", name="p", resource_version="7",
        observed_at=1.0, phase="Pending",
    )


def test_pod_event_round_trip_keeps_type_and_version() -> None:
    raw = encode(_seen())
    body = json.loads(raw)
    assert body["type"] == "PodSeen" and body["v"] == 1
    assert decode(raw, PodEvent) == _seen()


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"not json", "not a JSON object"),
        (b"[1,2]", "not a JSON object"),
        (b'{"type": "PodSeen"}', "no schema version"),
        (b'{"v": "1", "type": "PodSeen"}', "non-integer schema version"),
        (b'{"v": 99, "type": "PodSeen"}', "schema version 99"),
        (b'{"v": 1, "type": "PodExploded"}', "invalid"),
        (b'{"v": 1, "type": "PodGone", "uid": 5}', "invalid"),
    ],
)
def test_bad_payloads_raise_one_typed_error_saying_what(payload: bytes, fragment: str) -> None:
    with pytest.raises(SchemaError, match=fragment):
        decode(payload, PodEvent, what="pod event")


def test_gone_evidence_is_a_closed_set() -> None:
    good = PodGone(
        node="n", uid=UID, namespace="d", name="p", resource_version="1", observed_at=0,
        evidence="deleted",
    )
    bad = encode(good).replace(b'"deleted"', b'"missed-three-broadcasts"')
    with pytest.raises(SchemaError):
        decode(bad, PodEvent)


def test_claims_document_round_trip() -> None:
    claim = Claim(
        id="c1", state="creating", pod_uid=UID, namespace="d", name="p", container="main",
        resource="nvidia.com/mig-1g.10gb", device_ids=["t0"], card=0, profile="1g.10gb",
        start=0, size=1, created_at=1, updated_at=1,
    )
    doc = CardClaims(node="n", card=0, claims={"c1": claim})
    assert decode(encode(doc), CardClaims) == doc


def test_request_decoded_as_wrong_type_is_refused() -> None:
    with pytest.raises(SchemaError):
        decode(encode(PodsGet(uid=UID)), CardClaims)


@pytest.mark.parametrize(
    "uid", ["../../etc", "", "ABCDEF00-0000-0000-0000-000000000000", "a.b", "x" * 36, UID + "/"]
)
def test_odd_pod_uids_are_refused(uid: str) -> None:
    with pytest.raises(InvalidPodUID):
        validate_pod_uid(uid)


def test_well_formed_uid_accepted() -> None:
    assert validate_pod_uid(UID) == UID


@given(st.text(min_size=1, max_size=40))
def test_token_encoding_is_reversible_and_subject_safe(value: str) -> None:
    token = encode_token(value)
    assert decode_token(token) == value
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in token)


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_token_encoding_is_collision_free(a: str, b: str) -> None:
    if a != b:
        assert encode_token(a) != encode_token(b)


def test_names_with_dots_and_wildcards_stay_one_token() -> None:
    subject = pods_subject("node.example.com", UID)
    assert subject.count(".") == 3
    assert parts_subject("a*b>c", 3) == "pk.parts.a_2ab_3ec.3"
    assert claims_key("n_1", 12) == "n_5f1.12"


@pytest.mark.parametrize("token", ["", "a.b", "_zz", "_4", "a_41"])
def test_non_canonical_tokens_are_refused(token: str) -> None:
    with pytest.raises(TokenError):
        decode_token(token)


def test_card_unhealthy_is_an_addition_older_readers_refuse_cleanly() -> None:
    """CardUnhealthy (card health) was added within version 1. A reader of this build decodes
    it; a reader that predates it (its union lacks the tag) gets the one SchemaError, so its
    consumer dead-letters the entry and nothing changes. A capacity document a newer allocator
    writes with the card-health fields decodes under the older CardView, which ignores them."""
    import msgspec

    from schemas import CardUnhealthy, NodeCapacity, PartitionEvent
    from schemas.documents import CardView
    from schemas.events import (
        AllocateRefused,
        ClaimChanged,
        DestroyFailed,
        ForeignFound,
        ForeignGone,
        WorkdirCollected,
    )

    entry = CardUnhealthy(node="n", at=1.0, card=0, cause="xid-48", xid=48,
                          meaning="double-bit ECC error", claim_id="c", pod_uid="u",
                          namespace="ml", name="p")
    assert decode(encode(entry), PartitionEvent) == entry
    older = (ClaimChanged | DestroyFailed | ForeignFound | ForeignGone | WorkdirCollected
             | AllocateRefused)
    with pytest.raises(SchemaError, match="CardUnhealthy"):
        decode(encode(entry), older)

    class OlderCardView(msgspec.Struct, frozen=True, kw_only=True):
        index: int
        uuid: str
        model: str
        mode: str

    view = CardView(index=0, uuid="GPU-0", model="H100-80GB", mode="partition",
                    health="lost", cause="lost", meaning="the card stopped answering")
    doc = NodeCapacity(node="n", at=1.0, cards=[view])
    assert decode(encode(doc), NodeCapacity).cards[0].health == "lost"
    assert msgspec.json.decode(msgspec.json.encode(view), type=OlderCardView).index == 0
    without = msgspec.json.decode(msgspec.json.encode(
        {"index": 0, "uuid": "GPU-0", "model": "H100-80GB", "mode": "partition"}), type=CardView)
    assert without.health == "ok"  # what an older allocator wrote reads as healthy
