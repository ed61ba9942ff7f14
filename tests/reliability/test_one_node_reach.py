"""One node's credentials reach no further than that node: what the server and our own services
do on a service user's behalf, against a real nats-server with the shipped permissions
(compose/nats/nats.conf) and the topology `partkeeper provision` creates.

- a rollup header or a purge cannot empty a bucket or a stream (the server refuses them);
- a request's reply subject cannot make a responder write anywhere but an inbox that may ask,
  with the shipped grants and on a server without any (rpc drops, counts and logs once);
- a body nested thousands deep or near the size limit is one schema error: an error reply to a
  request, dead-lettered once and terminated when consumed;
- a push consumer delivering into another stream is refused by the server;
- messages past `max_msg_size` and streams past their size are refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from collections.abc import AsyncIterator, Iterator

import nats
import nats.aio.msg
import nats.errors
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import APIError
from prometheus_client import REGISTRY

from partkeeper.bus import ConsumerRunner, ensure_topology, request, serve
from partkeeper.bus.consumer import DEAD_LETTER_FIRST_BYTES, Delivery
from partkeeper.bus.kv import Bucket
from partkeeper.bus.permissions import ADMIN, inbox_prefix
from partkeeper.bus.rpc import BAD_REQUEST, Endpoint
from partkeeper.claims import ClaimsStore, machine
from partkeeper.claims.store import StoreReadError
from partkeeper_sim.stack.natsserver import NatsServer
from schemas import (
    ClaimsQuery,
    ClaimsReply,
    PodEvent,
    SchemaError,
    decode,
    encode,
)
from schemas.codec import MAX_DEPTH
from schemas.names import (
    BUCKET_CLAIMS,
    BUCKET_PODS,
    MAX_MSG_BYTES,
    STREAM_DLQ,
    STREAM_PODS,
    ConsumerSpec,
    claims_query_subject,
    dlq_subject,
    pods_filter,
    pods_subject,
)
from tests_support import until
from tests_support.access import ADMIN as ADMIN_LOGIN
from tests_support.access import CONFIG, NODE, OTHER, UID, Session
from tests_support.bus import gone

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

DEEP = 3000  # what restarted services: valid JSON, a few KB


@pytest.fixture(scope="module")
def shipped() -> Iterator[NatsServer]:
    """A nats-server with the shipped configuration, provisioned."""
    running = NatsServer(config=str(CONFIG)).start()
    asyncio.run(_provision(running.url))
    yield running
    running.stop()
    shutil.rmtree(running.store_dir, ignore_errors=True)


async def _provision(url: str) -> None:
    nc = await nats.connect(url, user="pk-provision", password="pk-provision-dev",
                            inbox_prefix=inbox_prefix("provision", None))
    try:
        await ensure_topology(nc.jetstream())
    finally:
        await nc.close()


@pytest.fixture
async def admin(shipped: NatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(shipped.url, user=ADMIN_LOGIN[0], password=ADMIN_LOGIN[1],
                            inbox_prefix=inbox_prefix(ADMIN, NODE))
    yield nc
    await nc.close()


async def _value(js: JetStreamContext, bucket: str, key: str) -> bytes | None:
    entry = await (await js.key_value(bucket)).get(key)
    return entry.value


async def _as(shipped: NatsServer, service: str) -> Session:
    return await Session().open_with(shipped.url, user=f"pk-{service}",
                                     password=f"pk-{service}-dev",
                                     inbox_prefix=inbox_prefix(service, NODE))


# -- 1. no rollups, no purges ----------------------------------------------------------------

@pytest.mark.parametrize(("service", "bucket", "own", "theirs"), [
    ("allocator", BUCKET_CLAIMS, f"{NODE}.0", f"{OTHER}.0"),
    ("reclaimer", BUCKET_CLAIMS, f"{NODE}.1", f"{OTHER}.1"),
    ("watcher", BUCKET_PODS, f"{NODE}.{UID}", f"{OTHER}.{UID}"),
])
async def test_one_message_with_a_rollup_header_empties_no_bucket(
        shipped: NatsServer, admin: Client, service: str, bucket: str, own: str,
        theirs: str) -> None:
    """`Nats-Rollup: all` on a key the user may write would have purged every node's keys of
    the bucket; the server refuses the message, and `sub` too."""
    js = admin.jetstream()
    kv = await js.key_value(bucket)
    await kv.put(theirs, b'{"v":1,"other":true}')
    user = await _as(shipped, service)
    try:
        ujs = user.client.jetstream()
        for rollup in ("all", "sub"):
            with pytest.raises(APIError, match=r"(?i)rollup"):
                await ujs.publish(f"$KV.{bucket}.{own}", b"{}", headers={"Nats-Rollup": rollup})
    finally:
        await user.close()
    assert await _value(js, bucket, theirs) == b'{"v":1,"other":true}'


async def test_purges_and_message_deletes_are_refused_even_to_the_admin(
        admin: Client) -> None:
    """The streams and buckets deny purges and deletes: no identity, the operators' included,
    can empty one through the API (`partkeeper provision` never asks it either)."""
    js = admin.jetstream()
    await (await js.key_value(BUCKET_CLAIMS)).put(f"{OTHER}.2", b"kept")
    for stream in (f"KV_{BUCKET_CLAIMS}", STREAM_PODS):
        with pytest.raises(APIError, match=r"(?i)purge"):
            await js.purge_stream(stream)
    with pytest.raises(APIError):
        await js.delete_msg(f"KV_{BUCKET_CLAIMS}", 1)
    assert await _value(js, BUCKET_CLAIMS, f"{OTHER}.2") == b"kept"


async def test_per_message_ttls_and_oversized_messages_are_refused(admin: Client) -> None:
    js = admin.jetstream()
    with pytest.raises(APIError):
        await js.publish(f"$KV.{BUCKET_CLAIMS}.{NODE}.7", b"{}", headers={"Nats-TTL": "1s"})
    with pytest.raises(APIError, match=r"(?i)maximum|size"):
        await js.publish(pods_subject(NODE, UID), b"x" * (MAX_MSG_BYTES + 1))
    for name in (STREAM_PODS, f"KV_{BUCKET_PODS}"):
        config = (await js.stream_info(name)).config
        assert config.max_bytes and config.max_bytes > 0
        assert config.max_msg_size == MAX_MSG_BYTES


# -- 2. replies go only to the asker's inbox -------------------------------------------------

def _dropped(endpoint: str) -> float:
    return REGISTRY.get_sample_value("partkeeper_requests_dropped_total",
                                     {"endpoint": endpoint}) or 0.0


async def _claims_service(nc: Client) -> object:
    async def answer(query: ClaimsQuery) -> ClaimsReply:
        return ClaimsReply()

    service = await serve(nc, name="pk-allocator", version="0.0.0", description="t",
                          endpoints=[Endpoint("claims-query", claims_query_subject(NODE),
                                              ClaimsQuery, answer)])
    # The server has the subscription once it answers a ping sent after it: another
    # connection's request may then not meet "no responders".
    await nc.flush()
    return service


async def _answered_where(asker: Client, reply: str) -> None:
    await asker.publish(claims_query_subject(NODE), b"{}", reply=reply)
    await asker.flush()


@pytest.mark.parametrize("target", [f"$KV.{BUCKET_CLAIMS}.{OTHER}.0",
                                    f"$KV.{BUCKET_CLAIMS}.{NODE}.0",
                                    f"$KV.{BUCKET_PODS}.{OTHER}.{UID}"])
async def test_a_reply_subject_cannot_make_the_responder_write(
        shipped: NatsServer, admin: Client, target: str) -> None:
    """The GC asks claims.query with its reply subject set to a claim key or a Pod record: the
    allocator's user has no grant there (no allow_responses) and rpc drops the request anyway.
    A request from the GC's own inbox is still answered."""
    js = admin.jetstream()
    bucket, key = target.split(".", 2)[1], target.split(".", 2)[2]
    await (await js.key_value(bucket)).put(key, b'{"v":1,"before":true}')
    allocator = await _as(shipped, "allocator")
    gc = await _as(shipped, "gc")
    try:
        await _claims_service(allocator.client)
        before = _dropped("claims-query")
        await _answered_where(gc.client, target)
        await until(lambda: _dropped("claims-query") >= before + 1, "the request dropped")
        reply = await request(gc.client, claims_query_subject(NODE), ClaimsQuery(), ClaimsReply)
        assert reply == ClaimsReply()
        await allocator.client.flush()
    finally:
        await gc.close()
        await allocator.close()
    assert await _value(js, bucket, key) == b'{"v":1,"before":true}'


async def test_a_responder_on_a_server_without_permissions_still_answers_only_inboxes(
        nats_server: NatsServer) -> None:
    """A misconfigured server (no users, so nothing stops a publish anywhere): rpc itself drops
    a request whose reply subject is no inbox that may ask, whatever it is."""
    node_nc = await nats.connect(nats_server.url, inbox_prefix=inbox_prefix("allocator", NODE))
    other_inbox = await nats.connect(nats_server.url)  # nats-py's default `_INBOX.<random>`
    try:
        js = node_nc.jetstream()
        await ensure_topology(js)
        await (await js.key_value(BUCKET_CLAIMS)).put(f"{OTHER}.0", b"theirs")
        await _claims_service(node_nc)
        before = _dropped("claims-query")
        for reply in (f"$KV.{BUCKET_CLAIMS}.{OTHER}.0", f"_INBOX.{OTHER}.gc.x",
                      f"_INBOX.{NODE}.watcher.x", f"_INBOX.{NODE}.gc", "_INBOX.x"):
            await _answered_where(other_inbox, reply)
        await until(lambda: _dropped("claims-query") >= before + 5, "five requests dropped")
        with pytest.raises(nats.errors.TimeoutError):
            await other_inbox.request(claims_query_subject(NODE), b"{}", timeout=0.5)
        assert await _value(js, BUCKET_CLAIMS, f"{OTHER}.0") == b"theirs"
    finally:
        await other_inbox.close()
        await node_nc.close()


# -- 3. one decode contract --------------------------------------------------------------------

def test_deep_nesting_and_oversized_bodies_are_schema_errors() -> None:
    deep = b'{"v":1,"x":' + b"[" * DEEP + b"]" * DEEP + b"}"
    for data in (deep, b"[" * DEEP, b'{"v":1,"a":"' + b"x" * MAX_MSG_BYTES + b'"}',
                 b'{"v":1,"a":' + b"{\"b\":" * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 2)):
        with pytest.raises(SchemaError):
            decode(data, PodEvent)
    # brackets inside strings are no nesting
    quoted = b'{"v":1,"type":"PodGone","name":"' + b"[" * DEEP + b'"}'
    with pytest.raises(SchemaError, match=r"invalid|required"):
        decode(quoted, PodEvent)


async def test_a_deeply_nested_request_gets_an_error_reply(
        shipped: NatsServer) -> None:
    allocator = await _as(shipped, "allocator")
    gc = await _as(shipped, "gc")
    try:
        await _claims_service(allocator.client)
        msg = await gc.client.request(claims_query_subject(NODE),
                                      b'{"x":' + b"[" * DEEP + b"]" * DEEP + b"}", timeout=5)
        assert msg.headers and msg.headers.get("Nats-Service-Error-Code") == str(BAD_REQUEST)
        # and the service goes on answering
        assert await request(gc.client, claims_query_subject(NODE), ClaimsQuery(),
                             ClaimsReply) == ClaimsReply()
    finally:
        await gc.close()
        await allocator.close()


async def test_poison_is_dead_lettered_once_and_terminated(
        nats_server: NatsServer, node: str) -> None:
    """A body nested thousands deep and one too large to carry into the dead letter whole:
    each is dead-lettered once (the large one as its first bytes, size and hash), terminated,
    and the consumer goes on to the next message."""
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    try:
        await ensure_topology(js)
        handled: list[PodEvent] = []

        async def handle(event: PodEvent, delivery: Delivery) -> None:
            handled.append(event)

        runner = ConsumerRunner(
            js, service="t", stream=STREAM_PODS, durable=f"t-{node.replace('.', '_')}",
            filter_subject=pods_filter(node), decode=lambda d: decode(d, PodEvent),
            handle=handle, dlq_subject=dlq_subject(node, "t"),
            spec=ConsumerSpec(ack_wait_seconds=2, max_deliver=3))
        deep = b'{"v":1,"x":' + b"[" * DEEP + b"]" * DEEP + b"}"
        large = b'{"v":1,"type":"PodGone","pad":"' + b"x" * (MAX_MSG_BYTES - 2000) + b'"}'
        subject = pods_subject(node, UID)
        for body in (deep, large):
            await js.publish(subject, body)
        await js.publish(subject, encode(gone(node)))
        task = asyncio.create_task(runner.run(fetch_timeout=0.5))
        try:
            await until(lambda: handled, "the good message after the two bad ones")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        info = await js.stream_info(STREAM_DLQ, subjects_filter=dlq_subject(node, "t"))
        assert sum((info.state.subjects or {}).values()) == 2
        last = await js.get_last_msg(STREAM_DLQ, dlq_subject(node, "t"))
        assert last.headers is not None and last.headers["Pk-Body"] == "first-bytes"
        assert last.headers["Pk-Original-Size"] == str(len(large))
        assert last.headers["Pk-Original-Sha256"] == hashlib.sha256(large).hexdigest()
        assert last.data == large[:DEAD_LETTER_FIRST_BYTES]
        consumer = await js.consumer_info(STREAM_PODS, runner.durable)
        assert consumer.num_ack_pending == 0 and consumer.num_pending == 0
        assert runner.dead_lettered == 2
    finally:
        await nc.close()


# -- a push consumer into another stream ---------------------------------------------------------

async def test_a_push_consumer_delivering_into_another_stream_is_refused(
        shipped: NatsServer, admin: Client) -> None:
    """The allocator may create named consumers on its node's records; one whose deliver subject
    is another node's claim key or Pod subject would have the server write there on its behalf.
    Into its own stream the server refuses to create it (a cycle); into another stream it
    delivers (a subscriber there sees the records), but the stream stores none of it: the key
    and the stream stay as they were."""
    js = admin.jetstream()
    target_key = f"{OTHER}.3"
    await (await js.key_value(BUCKET_CLAIMS)).put(target_key, b"theirs")
    pods = await js.key_value(BUCKET_PODS)
    await pods.put(f"{NODE}.{UID}", b'{"v":1}')
    allocator = await _as(shipped, "allocator")
    filter_subject = f"$KV.{BUCKET_PODS}.{NODE}.>"

    async def create(name: str, deliver: str) -> dict[str, object]:
        body = json.dumps({"stream_name": f"KV_{BUCKET_PODS}", "config": {
            "name": name, "deliver_subject": deliver, "ack_policy": "none",
            "filter_subject": filter_subject}}).encode()
        msg = await allocator.client.request(
            f"$JS.API.CONSUMER.CREATE.KV_{BUCKET_PODS}.{name}.{filter_subject}", body,
            timeout=5)
        answer: dict[str, object] = json.loads(msg.data)
        return answer

    try:
        cycle = await create("push0", f"$KV.{BUCKET_PODS}.{NODE}.zz")
        assert "cycle" in str(cycle.get("error")), cycle
        before = await _subject_count(js, STREAM_PODS, f"pk.pods.{OTHER}.{UID}")
        for i, deliver in enumerate((f"$KV.{BUCKET_CLAIMS}.{target_key}",
                                     f"pk.pods.{OTHER}.{UID}")):
            seen: list[bytes] = []

            async def on(msg: nats.aio.msg.Msg, into: list[bytes] = seen) -> None:
                into.append(msg.data)

            sub = await admin.subscribe(deliver, cb=on)
            answer = await create(f"push{i + 1}", deliver)
            if "error" not in answer:
                await pods.put(f"{NODE}.{UID}", f'{{"v":{i + 2}}}'.encode())
                await until(seen.__len__, f"the deliveries on {deliver}")
            await sub.unsubscribe()
    finally:
        await allocator.close()
    assert await _value(js, BUCKET_CLAIMS, target_key) == b"theirs"
    assert await _subject_count(js, STREAM_PODS, f"pk.pods.{OTHER}.{UID}") == before


async def _subject_count(js: JetStreamContext, stream: str, subject: str) -> int:
    info = await js.stream_info(stream, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


# -- what the server still writes on a node's behalf ---------------------------------------------

async def _server_answers_into(shipped: NatsServer, admin: Client, key: str) -> None:
    """The other node's claim document, then a publish of this node's reclaimer onto its own
    audit subject with the reply subject set to that document's key: the stream's PubAck (an
    error here, the body being no event) is written there by the server."""
    js = admin.jetstream()
    await (await js.key_value(BUCKET_CLAIMS)).put(key, encode(machine.empty(OTHER, 4)))
    reclaimer = await _as(shipped, "reclaimer")
    try:
        await reclaimer.client.publish(f"pk.parts.{NODE}.0", b"{}",
                                       reply=f"$KV.{BUCKET_CLAIMS}.{key}",
                                       headers={"Nats-Rollup": "all"})
        await reclaimer.client.flush()
    finally:
        await reclaimer.close()


async def test_the_servers_answer_lands_in_another_nodes_key_and_its_reader_refuses_it(
        shipped: NatsServer, admin: Client) -> None:
    """A known limit of one shared account (docs/security.md, "What the server still writes
    for a node"): nats-server writes its own answers (PubAcks, JetStream API responses, pull
    deliveries) to any reply subject, a stream's included, and NATS has no permission on reply
    subjects. This test waits for that write; with one account per node it would never come,
    and the test is to be turned around then. What lands is no document of that node: its
    claims store refuses to read it (StoreReadError, the card fails closed) rather than adopt
    it."""
    key = f"{OTHER}.4"
    await _server_answers_into(shipped, admin, key)
    js = admin.jetstream()

    async def written() -> bool:
        return b"PK_PARTITIONS" in (await _value(js, BUCKET_CLAIMS, key) or b"")

    await until(written, "the stream's answer written into the other node's key")
    store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), OTHER)

    async def refused() -> bool:
        try:
            await store.read(4)
        except StoreReadError:
            return True
        return False

    assert await refused()
