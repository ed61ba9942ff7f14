"""`partkeeper status` names the ResourceClaim a DRA claim was prepared for."""

from __future__ import annotations

import msgspec

from partkeeper.status import _claim_label, build, render
from schemas import CardClaims, NodeCapacity
from schemas.documents import CardView, InstanceView
from tests_support import make_claim


def test_status_carries_the_resource_claim() -> None:
    claim = msgspec.structs.replace(make_claim("u1.gpu-0-mig-1g10gb-0", 0, 1, state="active"),
                                    resource_claim="default/c1", resource_claim_uid="u1")
    capacity = NodeCapacity(node="n", at=0.0, cards=[CardView(
        index=0, uuid="GPU-0", model="H100-80GB", mode="partition", instances=[InstanceView(
            uuid="MIG-1", profile="1g.10gb", start=0, size=1, gi_id=1, foreign=False,
            claim_id=claim.id)])])
    doc = build("n", capacity, {0: CardClaims(node="n", card=0, claims={claim.id: claim})}, {})
    (card,) = doc["cards"]
    assert card["claims"][0]["resource_claim"] == "default/c1"
    assert card["instances"][0]["claim"]["resource_claim"] == "default/c1"
    assert _claim_label(card["instances"][0]["claim"], False) == "default/c1"
    assert _claim_label({"id": "abc", "resource_claim": ""}, False) == "abc"


def test_status_gives_each_claim_its_mode_and_which_are_adopted() -> None:
    dra = msgspec.structs.replace(make_claim("u1.gpu-0-mig-1g10gb-0", 0, 1, state="active"),
                                  resource_claim="default/c1", resource_claim_uid="u1")
    plugin = make_claim("dp-1", 2, 2, state="active")
    claims = {0: CardClaims(node="n", card=0, claims={dra.id: dra, plugin.id: plugin})}
    card = CardView(index=0, uuid="GPU-0", model="H100-80GB", mode="partition", instances=[])
    for running, adopted in (("dra", {"dp-1"}), ("deviceplugin", {dra.id}), ("", set())):
        capacity = NodeCapacity(node="n", at=0.0, cards=[card], allocator_mode=running)
        doc = build("n", capacity, claims, {})
        modes = {c["id"]: c["mode"] for c in doc["cards"][0]["claims"]}
        assert modes == {dra.id: "dra", "dp-1": "deviceplugin"}
        assert {c["id"] for c in doc["cards"][0]["claims"] if c["adopted"]} == adopted
        text = render(doc)
        assert ("(adopted)" in text) is bool(adopted)
        if running:
            assert f"allocator in {'DRA' if running == 'dra' else 'device-plugin'} mode" in text
