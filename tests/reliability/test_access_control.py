"""NATS users per service (compose/nats/nats.conf): each service runs on its own user, a whole
lifecycle works with all four, and a user is refused what belongs to another service or node.

The server is a real nats-server started with the shipped configuration. A refused publish or
subscription is reported by the server as a permissions violation, which the client receives
as an asynchronous error; each check waits (bounded) for exactly that error.
"""

from __future__ import annotations

import asyncio
import json

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client

from partkeeper.bus import ensure_topology, kv
from partkeeper.bus.ordered import OrderedWatch
from partkeeper.bus.permissions import PROVISION, inbox_prefix
from partkeeper.lifecycle import cancel_all
from partkeeper_sim.stack.launch import SERVICES
from partkeeper_sim.stack.natsserver import EmbeddedUsers, NatsServer
from schemas.names import STREAM_PARTITIONS, parts_filter
from tests_support import until
from tests_support.access import (
    ADMIN,
    ALLOWED_SECONDS,
    NODE,
    OTHER,
    OWN_EVENTS,
    OWN_READS,
    REFUSAL_SECONDS,
    UID,
    Session,
    all_refused,
    as_user,
    forbidden_watches,
    foreign_inboxes,
    none_refused,
    other_reads,
    others_events,
    topology_changes,
)
from tests_support.reliability import scene
from tests_support.watches import FAST, Entries, Reader

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

async def test_each_service_on_its_own_user_runs_a_lifecycle(server: NatsServer) -> None:
    async with scene(servers=[server], users=EmbeddedUsers.shipped()) as sc:
        partition = await sc.admit("1g.10gb", "acl")
        piece = await sc.admit(None, "acl")
        for pod in (partition, piece):
            await sc.work.delete(pod)
        await sc.check_converged()
        for name in SERVICES:
            log = sc.rig.layout.log(name).read_text()
            assert "permissions violation" not in log, f"{name} was refused something:\n" \
                f"{sc.logs([name], 30)}"


async def test_only_the_watcher_publishes_pod_events(server: NatsServer) -> None:
    subject = f"pk.pods.{NODE}.0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
    for service in ("allocator", "reclaimer", "gc"):
        session = await as_user(server, service)
        try:
            await session.client.publish(subject, b"{}")
            assert await session.refused("publish", subject), (service, session.errors)
        finally:
            await session.close()
    watcher = await as_user(server, "watcher")
    try:
        await watcher.client.publish(subject, b"{}")
        assert not await watcher.refused("publish", subject, ALLOWED_SECONDS), watcher.errors
    finally:
        await watcher.close()


async def test_the_gc_cannot_publish_partition_events_nor_reclaim(server: NatsServer) -> None:
    gc = await as_user(server, "gc")
    try:
        for subject in (f"pk.parts.{NODE}.0", f"pk.parts.{NODE}.1", f"pk.parts.{NODE}.node"):
            await gc.client.publish(subject, b"{}")
            assert await gc.refused("publish", subject), gc.errors
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await gc.client.request(f"pk.{NODE}.reclaim.now", b"{}", timeout=1.0)
        assert await gc.refused("publish", f"pk.{NODE}.reclaim.now"), gc.errors
        # What it may do: announce a collected working directory on its own audit subject.
        await gc.client.publish(f"pk.parts.{NODE}.gc", b"{}")
        assert not await gc.refused("publish", f"pk.parts.{NODE}.gc", ALLOWED_SECONDS), gc.errors
    finally:
        await gc.close()


@pytest.mark.parametrize("service", SERVICES)
async def test_a_node_user_cannot_reach_another_nodes_subjects(server: NatsServer,
                                                               service: str) -> None:
    session = await as_user(server, service)
    try:
        for subject in (f"pk.pods.{OTHER}.*", f"pk.parts.{OTHER}.*", f"pk.{OTHER}.pods.get",
                        f"pk.{OTHER}.reclaim.now", f"pk.{OTHER}.claims.query"):
            await session.client.subscribe(subject)
            assert await session.refused("subscription", subject), (service, session.errors)
        durable = f"{service}-pk_pods-{OTHER}"
        api = f"$JS.API.CONSUMER.CREATE.PK_PODS.{durable}.pk.pods.{OTHER}.*"
        await session.client.publish(api, b"{}")
        assert await session.refused("publish", api), (service, session.errors)
    finally:
        await session.close()


async def test_a_wrong_password_is_refused(server: NatsServer) -> None:
    with pytest.raises(nats.errors.Error):
        await nats.connect(server.url, user="pk-gc", password="pk-watcher-dev",
                           allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)


@pytest.mark.parametrize("service", SERVICES)
async def test_a_service_user_does_its_work_and_nothing_else(server: NatsServer,
                                                             service: str) -> None:
    admin = await nats.connect(server.url, user=ADMIN[0], password=ADMIN[1])
    try:
        await ensure_topology(admin.jetstream())
        session = await as_user(server, service)
        try:
            own_inbox = inbox_prefix(service, NODE) + ".x"
            await none_refused(session, OWN_EVENTS[service] + OWN_READS[service], [own_inbox])
            await all_refused(session, topology_changes() + other_reads()
                              + forbidden_watches(service) + others_events(service),
                              foreign_inboxes(service))
        finally:
            await session.close()
    finally:
        await admin.close()


async def test_a_service_reads_its_own_claims_through_direct_get_and_no_other_nodes(
        server: NatsServer) -> None:
    """The real client path: nats-py's KV get on a direct bucket, as the allocator's user on
    its private inbox; the same get of another node's key is refused by the server."""
    admin = await nats.connect(server.url, user=ADMIN[0], password=ADMIN[1])
    try:
        await ensure_topology(admin.jetstream())
        kv = await admin.jetstream().key_value("pk-claims")
        await kv.put(f"{NODE}.0", b"mine")
        await kv.put(f"{OTHER}.0", b"theirs")
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        nc = await nats.connect(server.url, user="pk-allocator", password="pk-allocator-dev",
                                inbox_prefix=inbox_prefix("allocator", NODE), error_cb=on_error,
                                allow_reconnect=False)
        try:
            own = await nc.jetstream(timeout=1.0).key_value("pk-claims")
            assert (await own.get(f"{NODE}.0")).value == b"mine"
            with pytest.raises(nats.errors.TimeoutError):  # refused: no reply ever comes
                await own.get(f"{OTHER}.0")
            wanted = f'permissions violation for publish to "$js.api.direct.get.kv_pk-claims.' \
                     f'$kv.pk-claims.{OTHER}.0"'
            await until(lambda: any(wanted in e for e in errors), "the refusal", 5)
        finally:
            await nc.close()
    finally:
        await admin.close()


async def test_the_provisioning_user_changes_topology_and_touches_no_node(
        server: NatsServer) -> None:
    session = await Session().open(server.url, "pk-provision", "pk-provision-dev")
    try:
        await all_refused(session, [f"pk.pods.{NODE}.{UID}", f"pk.parts.{NODE}.0",
                                     f"$KV.pk-claims.{NODE}.0",
                                     f"$JS.API.DIRECT.GET.KV_pk-claims.$KV.pk-claims.{NODE}.0",
                                     "$JS.API.STREAM.DELETE.PK_PODS"],
                           ["_INBOX.>", inbox_prefix("watcher", NODE) + ".>"])
    finally:
        await session.close()
    nc = await nats.connect(server.url, user="pk-provision", password="pk-provision-dev",
                            inbox_prefix=inbox_prefix(PROVISION, None), allow_reconnect=False)
    try:
        await ensure_topology(nc.jetstream(), replicas=1)
        await ensure_topology(nc.jetstream(), replicas=1)  # and again: an update
    finally:
        await nc.close()


# -- the allocator's watches: named consumers on its node's subjects only ----------------------

async def _records(admin: Client) -> None:
    """Claims, Pod records and audit entries of both nodes."""
    js = admin.jetstream()
    await ensure_topology(js)
    for bucket in ("pk-claims", "pk-pods"):
        store = await js.key_value(bucket)
        for node in (NODE, OTHER):
            await store.put(f"{node}.0", node.encode())
    for node in (NODE, OTHER):
        await js.publish(f"pk.parts.{node}.0", node.encode())


async def _as_allocator(server: NatsServer) -> Session:
    return await Session().open_with(server.url, user="pk-allocator",
                                     password="pk-allocator-dev",
                                     inbox_prefix=inbox_prefix("allocator", NODE))


async def test_the_allocator_watches_its_nodes_records_and_is_refused_another_nodes(
        server: NatsServer) -> None:
    admin = await nats.connect(server.url, user=ADMIN[0], password=ADMIN[1])
    session = await _as_allocator(server)
    nc = session.nc
    assert nc is not None
    watches: list[asyncio.Task[None]] = []
    try:
        await _records(admin)
        for bucket in ("pk-claims", "pk-pods"):
            own = Entries(kv.watch(nc, bucket, f"{NODE}.*", **FAST))
            watches.append(own.task)
            await asyncio.wait_for(own.caught_up.wait(), 10)
            assert own.keys() == [f"{NODE}.0"], bucket
        parts = Reader(OrderedWatch(nc, STREAM_PARTITIONS, parts_filter(NODE), **FAST))
        watches.append(parts.task)
        await until(lambda: len(parts.msgs) >= 1, "this node's audit entry")
        assert [m.subject for m in parts.msgs] == [f"pk.parts.{NODE}.0"]
        # The same watches of the other node: the server refuses the create itself.
        for bucket in ("pk-claims", "pk-pods"):
            theirs = Entries(kv.watch(nc, bucket, f"{OTHER}.*", **FAST))
            watches.append(theirs.task)
            await until(lambda b=bucket: _refused_create(session, f"kv_{b}",  # type: ignore[misc]
                                                         f"$kv.{b}.{OTHER}.*"),
                        f"the refused watch of {bucket}", REFUSAL_SECONDS)
            assert not theirs.got and not theirs.caught_up.is_set()
        foreign = Reader(OrderedWatch(nc, STREAM_PARTITIONS, parts_filter(OTHER), **FAST))
        watches.append(foreign.task)
        await until(lambda: _refused_create(session, "pk_partitions", f"pk.parts.{OTHER}.*"),
                    "the refused follow of the other node's audit entries", REFUSAL_SECONDS)
        assert not foreign.msgs
        # nats-py's own ordered consumer (the previous allocator's way) names no node: refused.
        with pytest.raises(nats.errors.TimeoutError):
            await nc.jetstream(timeout=1.0).subscribe(parts_filter(OTHER),
                                                      stream=STREAM_PARTITIONS,
                                                      ordered_consumer=True)
    finally:
        await cancel_all(watches)
        await session.close()
        await admin.close()


def _refused_create(session: Session, stream: str, filter_subject: str) -> bool:
    start = f'permissions violation for publish to "$js.api.consumer.create.{stream}.'
    return any(start in e and e.split(start, 1)[1].split(".", 1)[1].startswith(
        f'{filter_subject.lower()}"') for e in session.errors)


@pytest.mark.parametrize("body", [
    {"filter_subject": f"$KV.pk-claims.{OTHER}.*"},
    {"filter_subjects": [f"$KV.pk-claims.{OTHER}.*"]},
    {"filter_subject": f"$KV.pk-claims.{NODE}.*", "filter_subjects": [f"$KV.pk-claims.{OTHER}.*"]},
])
async def test_a_create_on_its_own_subject_cannot_carry_another_nodes_filter(
        server: NatsServer, body: dict[str, object]) -> None:
    """The grant names the node in the create subject; the server holds the body's filter to it
    (nats-server jetstream_api.go, jsConsumerCreateRequest), so the body cannot widen it."""
    admin = await nats.connect(server.url, user=ADMIN[0], password=ADMIN[1])
    session = await _as_allocator(server)
    assert session.nc is not None
    try:
        await _records(admin)
        name = "sneak"
        request = {"stream_name": "KV_pk-claims",
                   "config": {"name": name, "deliver_subject": session.nc.new_inbox(),
                              "ack_policy": "none", **body}}
        reply = await session.nc.request(
            f"$JS.API.CONSUMER.CREATE.KV_pk-claims.{name}.$KV.pk-claims.{NODE}.*",
            json.dumps(request).encode(), timeout=5)
        answer = json.loads(reply.data)
        assert "error" in answer, answer
        with pytest.raises(nats.js.errors.NotFoundError):
            await admin.jetstream().consumer_info("KV_pk-claims", name)
    finally:
        await session.close()
        await admin.close()


async def test_the_allocators_watch_resumes_under_a_new_name_with_no_gap_nor_duplicate(
        server: NatsServer) -> None:
    """The consumer deleted under the watch (as the server does when it restarts or the
    connection was gone past the inactive threshold): a new one, still on the node's subjects,
    resumes after the last entry seen."""
    admin = await nats.connect(server.url, user=ADMIN[0], password=ADMIN[1])
    session = await _as_allocator(server)
    assert session.nc is not None
    watches: list[asyncio.Task[None]] = []
    try:
        await _records(admin)
        claims = await admin.jetstream().key_value("pk-claims")
        own = Entries(kv.watch(session.nc, "pk-claims", f"{NODE}.*", **FAST))
        watches.append(own.task)
        await asyncio.wait_for(own.caught_up.wait(), 10)
        first = await _watch_consumers(admin, f"$KV.pk-claims.{NODE}.*")
        assert len(first) == 1, first
        await admin.jetstream().delete_consumer("KV_pk-claims", first[0])
        for card in (1, 2, 3):
            await claims.put(f"{NODE}.{card}", b"new")
            await claims.put(f"{OTHER}.{card}", b"new")
        await until(lambda: len(own.got) >= 4, "the claims written after the reset")
        assert own.keys() == [f"{NODE}.{c}" for c in range(4)]
        revisions = [e.revision or 0 for e in own.got]
        assert revisions == sorted(set(revisions))
        now = await _watch_consumers(admin, f"$KV.pk-claims.{NODE}.*")
        assert len(now) == 1 and now != first, (first, now)
        assert not [e for e in session.errors if "permissions violation" in e], session.errors
    finally:
        await cancel_all(watches)
        await session.close()
        await admin.close()


async def _watch_consumers(admin: Client, filter_subject: str) -> list[str]:
    infos = await admin.jetstream().consumers_info("KV_pk-claims")
    return [i.name for i in infos if i.config.filter_subject == filter_subject]


async def test_the_allocators_watch_answers_flow_control_on_its_own_grants(
        server: NatsServer) -> None:
    """A replay of several megabytes (64 Pod records of 128 KiB) comes whole and without a
    permissions violation: the server's flow-control requests are answered on
    `$JS.FC.KV_pk-pods.>` (the role's grant, no allow_responses), as is a stalled
    heartbeat's `$JS.FC.KV_pk-pods.<consumer>.<token>`; without them the replay would stall at
    its first window."""
    admin = await nats.connect(server.url, user=ADMIN[0], password=ADMIN[1])
    session = await _as_allocator(server)
    assert session.nc is not None
    watches: list[asyncio.Task[None]] = []
    try:
        await ensure_topology(admin.jetstream())
        pods = await admin.jetstream().key_value("pk-pods")
        for index in range(64):
            await pods.put(f"{NODE}.big-{index}", b"x" * 128 * 1024)
        own = Entries(kv.watch(session.nc, "pk-pods", f"{NODE}.*", **FAST))
        watches.append(own.task)
        await asyncio.wait_for(own.caught_up.wait(), 30)
        assert len(own.got) == 64
        assert not [e for e in session.errors if "permissions violation" in e], session.errors
    finally:
        await cancel_all(watches)
        await session.close()
        await admin.close()
