"""The host's boot on the claims documents: `machine.after_boot` and `machine.remake` (pure), and
the claims a reboot left holding no room anywhere the allocator or the reclaimer looks
(inventory, placement, DRA slices). docs/operations.md, "After a reboot"."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.js import JetStreamContext

from partkeeper import bootid
from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore, inventory, machine, outbox
from partkeeper.claims.boot import settle
from partkeeper.claims.machine import TransitionError
from partkeeper.dra import slices
from partkeeper.drivers.base import Instance, slot_identity
from schemas import CardClaims, Claim, LiveInstance, decode, encode
from schemas.events import ClaimState
from schemas.names import BUCKET_CLAIMS
from services.allocator.core import placement

UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
OLD, NEW = "2f0c1b7e-8d2a-4a57-9c1e-3b6f7d8e9a01", "7a1e2c3d-4b5f-4e6a-8b9c-0d1e2f3a4b5c"


def claim(cid: str, start: int, size: int = 1, state: ClaimState = "active", *,
          kind: str = "partition", rebooted: bool = False) -> Claim:
    live = LiveInstance(gi_id=start + 1, ci_id=0, uuid=f"MIG-{cid}") \
        if state != "creating" and kind == "partition" else None
    return Claim(id=cid, kind=kind, state=state, pod_uid=UID, namespace="d", name="p",  # type: ignore[arg-type]
                 container="c", resource="nvidia.com/mig-x", device_ids=[f"t-{cid}"], card=0,
                 profile="x", start=start, size=size, instance=live, created_at=0, updated_at=0,
                 rebooted=rebooted)


def doc(*claims: Claim, boot: str = OLD) -> CardClaims:
    return CardClaims(node="n", card=0, claims={c.id: c for c in claims}, boot_id=boot)


def test_a_plain_restart_changes_nothing() -> None:
    before = doc(claim("a", 0), claim("b", 2, state="releasing"))
    assert machine.after_boot(before, OLD) is before


def test_a_document_without_a_boot_records_it_and_nothing_else() -> None:
    # What an earlier version wrote (or a new document): its Pods run on; the boot is noted.
    before = doc(claim("a", 0), boot="")
    after = machine.after_boot(before, NEW)
    assert after.boot_id == NEW and after.claims == before.claims


def test_a_reboot_marks_every_partition_claim_and_keeps_the_rest() -> None:
    before = doc(claim("a", 0), claim("b", 2, state="creating"),
                 claim("c", 4, state="releasing"), claim("s", 0, kind="slice", state="active"))
    after = machine.after_boot(before, NEW)
    assert after.boot_id == NEW
    assert {cid for cid, c in after.claims.items() if c.rebooted} == {"a", "b", "c"}
    for cid, c in after.claims.items():  # nothing else of a claim changes: IDs, spot, state
        assert msgspec.structs.replace(c, rebooted=False) == \
            msgspec.structs.replace(before.claims[cid], rebooted=False)
    assert machine.after_boot(after, NEW) is after


def test_an_empty_boot_id_is_refused() -> None:
    with pytest.raises(TransitionError):
        machine.after_boot(doc(), "")


boots = st.lists(st.sampled_from([OLD, NEW, "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"]),
                 min_size=1, max_size=5)
states = st.sampled_from(["creating", "active", "releasing"])


@given(boots, st.lists(st.tuples(states, st.booleans()), max_size=4))
def test_boots_mark_only_on_a_change_and_never_twice(seq: list[str], shape: list) -> None:
    claims = [claim(f"c{i}", 2 * i, state=s, kind="partition" if p else "slice")
              for i, (s, p) in enumerate(shape)]
    current = doc(*claims, boot="")
    changed_boot = False
    for boot in seq:
        nxt = machine.after_boot(current, boot)
        assert machine.after_boot(nxt, boot) is nxt  # idempotent: a second service finds it done
        changed_boot = changed_boot or (current.boot_id not in ("", boot))
        current = nxt
    for c in current.claims.values():
        assert c.rebooted == (changed_boot and c.kind == "partition")


def test_remake_writes_the_claim_creating_at_its_new_spot_before_any_create() -> None:
    rebooted = machine.after_boot(doc(claim("a", 0, 2)), NEW)
    again = machine.remake(rebooted, "a", 2, 2, 5.0)
    made = again.claims["a"]
    assert (made.state, made.start, made.size, made.instance, made.rebooted, made.remakes) == \
        ("creating", 2, 2, None, False, 1)
    assert made.device_ids == ["t-a"] and made.pod_uid == UID
    # Audit entries of a re-made claim carry its re-makes: not dropped as re-sends.
    [entry] = outbox.transitions(rebooted, again, 5.0)
    assert entry.msg_id == "claim/a/1/creating"


@pytest.mark.parametrize("c", [claim("a", 0), claim("a", 0, state="releasing", rebooted=True)],
                         ids=["not rebooted", "releasing"])
def test_remake_refuses_what_a_reboot_did_not_leave(c: Claim) -> None:
    with pytest.raises(TransitionError):
        machine.remake(doc(c), "a", 0, 1, 1.0)


def test_remake_and_begin_overlap_only_what_holds_room() -> None:
    # A rebooted claim holds no room: a new claim may take its spot, and it is re-made elsewhere.
    d = doc(claim("old", 0, 2, rebooted=True), claim("old2", 2, 2, rebooted=True))
    d = machine.begin(d, claim("new", 0, 2, state="creating"))
    with pytest.raises(TransitionError):
        machine.remake(d, "old", 0, 2, 1.0)
    d = machine.remake(d, "old", 2, 2, 1.0)  # over old2, rebooted too
    assert d.claims["old"].start == 2
    with pytest.raises(TransitionError):
        machine.begin(d, claim("late", 2, 1, state="creating"))


def test_a_rebooted_claim_owns_nothing_and_an_instance_at_its_slot_is_foreign() -> None:
    # The sim's UUIDs are name-based: a partition carved at the slot after the reboot has the
    # same identity as the one the reboot removed. It must never be taken for the claim's own
    # (the reclaimer would destroy it).
    c = claim("a", 0, rebooted=True)
    assert c.instance is not None
    same = Instance(0, "x", 0, 1, c.instance.gi_id, 0, c.instance.uuid)
    inv = inventory.classify(doc(c), [same], slot_identity)
    assert inv.owned == {} and inv.vanished == [] and inv.foreign == [same]
    assert inv.rebooted == ["a"]


@given(st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=6))
def test_rebooted_claims_count_nothing_occupied(spots: list[tuple[int, bool]]) -> None:
    claims = [claim(f"c{i}", s, rebooted=r) for i, (s, r) in enumerate(spots)]
    holding = [c for c in claims if not c.rebooted]
    assert placement.occupied(claims, [], "partition") == placement.occupied(holding, [],
                                                                           "partition")
    assert slices.occupied(claims, []) == slices.occupied(holding, [])


def test_an_earlier_versions_document_reads_without_the_boot_fields() -> None:
    # Upgrades keep running Pods: a version-1 document written before boot ids were recorded.
    old = doc(claim("a", 0), boot="")
    raw = msgspec.json.decode(encode(old))
    raw.pop("boot_id")
    for c in raw["claims"].values():
        c.pop("rebooted")
        c.pop("remakes")
    read = decode(msgspec.json.encode(raw), CardClaims)
    assert read.boot_id == "" and not read.claims["a"].rebooted and read.claims["a"].remakes == 0
    assert read.v == 1


# -- the shell at a service's start (claims/boot.settle), on a real store ----------------------


async def test_settle_marks_once_and_an_unreadable_boot_id_changes_nothing(
    js: JetStreamContext, node: str, tmp_path: Path
) -> None:
    store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), node)
    await store.update(0, lambda d: machine.begin(d, claim("a", 0, state="creating")))
    # No boot id file: nothing is written, nothing is taken for a reboot.
    written = (await store.read(0))[1]
    assert await settle(store, [0, 1], tmp_path) is None
    assert (await store.read(0))[1] == written and (await store.read(1))[1] == 0

    bootid.write(tmp_path, OLD)
    assert await settle(store, [0, 1], tmp_path) == OLD  # first boot seen: recorded only
    first = {card: await store.read(card) for card in (0, 1)}
    assert all(d.boot_id == OLD for d, _ in first.values())
    assert not first[0][0].claims["a"].rebooted
    assert await settle(store, [0, 1], tmp_path) == OLD  # a plain restart writes nothing
    assert {card: (await store.read(card))[1] for card in (0, 1)} == \
        {card: rev for card, (_, rev) in first.items()}

    bootid.write(tmp_path, NEW)  # the host rebooted
    assert await settle(store, [0, 1], tmp_path) == NEW
    doc0, rev = await store.read(0)
    assert doc0.boot_id == NEW and doc0.claims["a"].rebooted
    assert await settle(store, [0, 1], tmp_path) == NEW  # the other service: nothing to do
    assert (await store.read(0))[1] == rev
