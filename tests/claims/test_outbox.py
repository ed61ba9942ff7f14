"""The claims store is the outbox of the audit log (partkeeper/claims/outbox.py): a transition
and its ClaimChanged are written together, and nothing recorded in a claim is missing from
PK_PARTITIONS once the bus answers again: not after a crash between the write and the publish
and a NATS restart, not after a refused publish. Exactly once, by the message id."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js import api

from partkeeper.bus import ensure_topology
from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore, machine, outbox
from partkeeper_sim.stack.natsserver import NatsServer
from schemas import CardClaims, ClaimChanged, LiveInstance, SchemaError, decode
from schemas.names import BUCKET_CLAIMS, STREAM_PARTITIONS, parts_filter
from tests_support import make_claim, until
from tests_support.audit_hold import hold_audit

NODE = "node-outbox"
LIVE = LiveInstance(gi_id=1, ci_id=0, uuid="MIG-1")

# A card's document as the previous version wrote it: no `outbox` key.
OLD_DOCUMENT = (
    b'{"type":"CardClaims","v":1,"node":"node-outbox","card":0,"claims":{"c1":{"id":"c1",'
    b'"kind":"partition","state":"active","pod_uid":"0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b",'
    b'"namespace":"default","name":"pod","container":"main","resource":"nvidia.com/mig-test",'
    b'"device_ids":["c1"],"card":0,"profile":"test","start":0,"size":2,"instance":{"gi_id":1,'
    b'"ci_id":0,"uuid":"MIG-1"},"created_at":0.0,"updated_at":0.0,"release_reason":"",'
    b'"release_attempts":0,"resource_claim":"","resource_claim_uid":""}}}'
)


def test_a_document_of_the_previous_version_still_decodes() -> None:
    doc = decode(OLD_DOCUMENT, CardClaims)
    assert doc.outbox == [] and doc.claims["c1"].state == "active"


@pytest.mark.parametrize(("steps", "states"), [
    (["begin"], ["creating"]),
    (["begin", "activate"], ["creating", "active"]),
    (["begin", "activate", "release"], ["creating", "active", "releasing"]),
    (["begin", "activate", "release", "attempt"], ["creating", "active", "releasing"]),
    (["begin", "activate", "release", "remove"], ["creating", "active", "releasing", "removed"]),
    (["begin", "abandon"], ["creating", "removed"]),
])
def test_each_transition_becomes_one_entry(steps: list[str], states: list[str]) -> None:
    apply = {
        "begin": lambda d: machine.begin(d, make_claim("c1", 0, 2)),
        "activate": lambda d: machine.activate(d, "c1", LIVE, 1),
        "release": lambda d: machine.release(d, "c1", "Pod gone (deleted)", 2),
        "attempt": lambda d: machine.count_attempt(d, "c1", 3),
        "remove": lambda d: machine.remove(d, "c1"),
        "abandon": lambda d: machine.remove(d, "c1", abandon=True),
    }
    doc = machine.empty(NODE, 0)
    for step in steps:
        doc = outbox.record(doc, apply[step](doc), (), 9.0)
    assert [e.event.state for e in doc.outbox] == states
    assert [e.msg_id for e in doc.outbox] == [f"claim/c1/{s}" for s in states]
    assert all(e.event.node == NODE for e in doc.outbox)
    if "remove" in steps:
        assert doc.outbox[-1].event.reason == "Pod gone (deleted)"
        assert doc.outbox[-1].event.instance_uuid == "MIG-1"
    stripped = outbox.strip(doc, {doc.outbox[0].msg_id})
    assert [e.event.state for e in stripped.outbox] == states[1:]
    assert outbox.strip(stripped, {"claim/other/active"}) is stripped


def test_a_writer_says_why_it_removed_a_claim() -> None:
    """A removed claim is gone from the new document, and its release reason is why it was
    released: the reclaimer's reason for the removal (its instance destroyed, MIG switched off
    under it) reaches the audit entry only as the write's `reasons`."""
    doc = machine.begin(machine.empty(NODE, 0), make_claim("c1", 0, 2))
    doc = machine.release(machine.activate(doc, "c1", LIVE, 1), "c1", "Pod gone (deleted)", 2)
    removed = machine.remove(doc, "c1")
    [plain] = outbox.record(doc, removed, (), 9.0).outbox
    [told] = outbox.record(doc, removed, (), 9.0, {"c1": "MIG mode was switched off"}).outbox
    assert plain.event.reason == "Pod gone (deleted)"
    assert told.event.reason == "MIG mode was switched off"
    assert told.msg_id == plain.msg_id  # the same entry: a re-send is still de-duplicated


@pytest.fixture
async def own() -> AsyncIterator[tuple[NatsServer, Client]]:
    server = NatsServer().start()
    client = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    await ensure_topology(client.jetstream())
    yield server, client
    await client.close()
    server.stop()
    shutil.rmtree(server.store_dir, ignore_errors=True)


async def audit_of(client: Client, claim_id: str) -> list[ClaimChanged]:
    """Every ClaimChanged of `claim_id` stored in PK_PARTITIONS (read through to the end)."""
    js = client.jetstream()
    last = (await js.stream_info(STREAM_PARTITIONS)).state.last_seq
    found: list[ClaimChanged] = []
    if last == 0:
        return found
    sub = await js.subscribe(parts_filter(NODE), ordered_consumer=True,
                             deliver_policy=api.DeliverPolicy.ALL)
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            try:
                event = decode(msg.data, ClaimChanged)
            except SchemaError:
                event = None  # the filler of the full-stream test
            if event is not None and event.claim_id == claim_id:
                found.append(event)
            if msg.metadata.sequence.stream >= last:
                return found
    finally:
        await sub.unsubscribe()


async def store_on(client: Client) -> ClaimsStore:
    return ClaimsStore(await Bucket.open(client.jetstream(), BUCKET_CLAIMS), NODE, announce=True)


_WRITER = """
import asyncio, sys
import nats
from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore, machine
from schemas.names import BUCKET_CLAIMS
from tests_support import make_claim

async def main():
    nc = await nats.connect(sys.argv[1])
    store = ClaimsStore(await Bucket.open(nc.jetstream(), BUCKET_CLAIMS), sys.argv[2],
                        announce=True)
    await store.update(0, lambda d: machine.begin(d, make_claim("c-crash", 0, 2)))

asyncio.run(main())
"""


async def test_a_crash_between_the_write_and_the_event_then_a_nats_restart_loses_nothing(
        own: tuple[NatsServer, Client]) -> None:
    """The writer dies at `claims.after_write` (the claim is in the store, its event is not
    on the bus), NATS restarts, and the next flush sends it: once, however often it runs."""
    server, client = own
    env = {**os.environ, "PK_FAULTS": "claims.after_write=exit",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = await asyncio.create_subprocess_exec(sys.executable, "-c", _WRITER, server.url, NODE,
                                                  env=env)
    assert await asyncio.wait_for(writer.wait(), 60) == 86  # the fault point's exit status
    assert await audit_of(client, "c-crash") == []
    await asyncio.to_thread(server.restart)
    await until(lambda: client.is_connected, "the client reconnected", 20)
    store = await store_on(client)
    doc, _ = await store.read(0)
    assert [e.msg_id for e in doc.outbox] == ["claim/c-crash/creating"]
    assert await store.flush_outbox() == 0
    assert await store.flush_outbox() == 0  # nothing left to send
    assert (await store.read(0))[0].outbox == []
    assert [e.state for e in await audit_of(client, "c-crash")] == ["creating"]


async def test_a_publish_sent_twice_is_stored_once(own: tuple[NatsServer, Client]) -> None:
    """The entry stays when its publish landed but its strip did not (a process dying right
    after publishing): a later process re-sends it, and the message id keeps it once."""
    _, client = own
    first = await store_on(client)
    await first.update(0, lambda d: machine.begin(d, make_claim("c-twice", 0, 2)))
    await first.drain()
    assert [e.state for e in await audit_of(client, "c-twice")] == ["creating"]
    later = await store_on(client)  # a new process: knows nothing was sent
    assert [e.msg_id for e in (await later.read(0))[0].outbox] == ["claim/c-twice/creating"]
    assert await later.flush_outbox() == 0
    assert (await later.read(0))[0].outbox == []
    assert [e.state for e in await audit_of(client, "c-twice")] == ["creating"]


async def test_a_refused_publish_is_kept_in_the_document_until_the_stream_takes_it(
        own: tuple[NatsServer, Client]) -> None:
    """PK_PARTITIONS full (discard new) refuses the event while the store works: the
    transitions wait in the document, survive a new process, and go out once it has room."""
    _, client = own
    js = client.jetstream()
    config = (await js.stream_info(STREAM_PARTITIONS)).config
    full = api.StreamConfig.from_response(config.as_dict())
    full.max_msgs, full.discard = 1, api.DiscardPolicy.NEW
    await js.publish("pk.parts.node-outbox.node", b"{}")  # the one message it holds
    await js.update_stream(full)
    store = await store_on(client)
    await store.update(0, lambda d: machine.begin(d, make_claim("c-full", 0, 2)))
    await store.update(0, lambda d: machine.activate(d, "c-full", LIVE, 1))
    doc, _ = await store.read(0)
    assert [e.event.state for e in doc.outbox] == ["creating", "active"]
    later = await store_on(client)
    assert await later.flush_outbox() == 2  # still refused; still kept
    await ensure_topology(js)  # provisioning puts the contract's limits back
    assert await later.flush_outbox() == 0
    assert [e.state for e in await audit_of(client, "c-full")] == ["creating", "active"]
    assert (await later.read(0))[0].outbox == []


async def test_a_write_does_not_wait_for_its_announcement_and_they_leave_in_order(
        own: tuple[NatsServer, Client]) -> None:
    """With the audit stream held up, both writes return (the entries are in the document, so
    the writer need not wait: issue 27, the Allocate's hot path); once it answers, the entries
    reach PK_PARTITIONS in the order they were written."""
    _, client = own
    held = hold_audit(client)
    store = await store_on(client)
    await asyncio.wait_for(
        store.update(0, lambda d: machine.begin(d, make_claim("c-order", 0, 2))), 10)
    await asyncio.wait_for(store.update(0, lambda d: machine.activate(d, "c-order", LIVE, 1)), 10)
    assert await audit_of(client, "c-order") == []  # nothing has left yet
    held.set()
    await store.drain(timeout=10)
    assert [e.state for e in await audit_of(client, "c-order")] == ["creating", "active"]
