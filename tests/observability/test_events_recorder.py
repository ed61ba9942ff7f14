"""Kubernetes Events from the partition audit log: the watcher in-process, a real nats-server, the
simulated API server reached by the real client. Entries are published as the allocator and the
reclaimer publish them (partkeeper.bus.publish). An Event is recorded only on a Pod the watcher's
own view holds on this node, so each test's Pod is bound to the node and in the view first."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any

import msgspec
import pytest
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError

from partkeeper.bus import publish
from partkeeper_sim.apiserver import ApiServerThread
from schemas import CardHealthChanged, ForeignFound, PodRecord, decode
from schemas.names import (
    BUCKET_PODS,
    STREAM_DLQ,
    STREAM_PARTITIONS,
    dlq_subject,
    durable_name,
    gc_parts_subject,
    parts_subject,
    pods_key,
)
from services.watcher.node_note import CARD_HEALTH
from services.watcher.recorder import SERVICE
from tests_support import until
from tests_support.entries import MIG, card_unhealthy, claim, destroy_failed, refused
from tests_support.kubeclient import pod_manifest
from tests_support.observability import DEADLINE, acknowledged
from tests_support.watcher import EVENTS_FAST, log_lines


def durable(node: str) -> str:
    return durable_name(SERVICE, node, STREAM_PARTITIONS)


def ours(apiserver: ApiServerThread, uid: str) -> list[dict[str, Any]]:
    return [e for e in apiserver.events() if e["involvedObject"].get("uid") == uid]


async def emit(
    js: JetStreamContext, node: str, event: Any, msg_id: str, *, age: float = 0.0
) -> int:
    """Publish an audit entry of this node, made `age` seconds ago, under a msg id of its own;
    returns its stream sequence."""
    event = msgspec.structs.replace(event, node=node, at=time.time() - age)
    ack = await publish(js, parts_subject(node, getattr(event, "card", None)), event,
                        msg_id=f"{msg_id}/{uuid.uuid4().hex}")
    return ack.seq


async def record_of(js: JetStreamContext, node: str, uid: str) -> PodRecord | None:
    try:
        entry = await (await js.key_value(BUCKET_PODS)).get(pods_key(node, uid))
    except KeyNotFoundError:
        return None
    return None if entry.value is None else decode(entry.value, PodRecord)


async def held(apiserver: ApiServerThread, js: JetStreamContext, node: str,
               name: str = "train-0", namespace: str = "ml") -> str:
    """A Pod bound to `node`, once the running watcher's view holds it; its uid."""
    pod = apiserver.create_pod(pod_manifest(name, node=node), namespace=namespace)
    uid: str = pod["metadata"]["uid"]
    await until(lambda: record_of(js, node, uid), f"Pod {uid} in the watcher's view", DEADLINE)
    return uid


async def gone(js: JetStreamContext, node: str, uid: str) -> bool:
    record = await record_of(js, node, uid)
    return record is not None and record.state == "gone"


async def all_acknowledged(js: JetStreamContext, node: str, seq: int) -> None:
    await until(lambda: acknowledged(js, STREAM_PARTITIONS, durable(node), seq),
                f"the Event recorder to acknowledge up to sequence {seq}", DEADLINE)


async def test_an_allocation_its_blocked_destroy_and_its_reclaim_become_pod_events(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str
) -> None:
    pod = apiserver.create_pod(pod_manifest("train-0", node=node), namespace="ml")
    uid = pod["metadata"]["uid"]
    await start_watcher(EVENTS_FAST)
    entries = [
        claim("creating", pod_uid=uid, instance_uuid=None),
        claim("active", pod_uid=uid),
        claim("releasing", pod_uid=uid, reason="Pod gone (deleted)"),
        destroy_failed(pod_uid=uid),  # names no Pod: the watcher's view does
        claim("removed", pod_uid=uid, reason="instance destroyed or confirmed absent"),
        refused(pod_uid=uid),
        refused(pod_uid="", namespace="", name=""),
        ForeignFound(node=node, at=0, card=0, instance_uuid=MIG, profile="1g.10gb",
                     start=0, size=2),
    ]
    for i, entry in enumerate(entries):
        last = await emit(js, node, entry, f"e{i}")
    await all_acknowledged(js, node, last)

    recorded = sorted(ours(apiserver, uid), key=lambda e: int(e["metadata"]["resourceVersion"]))
    assert [(e["reason"], e["type"]) for e in recorded] == [
        ("PartitionAllocated", "Normal"), ("ReclaimBlocked", "Warning"),
        ("PartitionReclaimed", "Normal"), ("AllocateRefused", "Warning"),
    ]
    for event in recorded:
        assert event["metadata"]["namespace"] == "ml"
        assert event["metadata"]["name"].startswith("train-0.")
        assert event["involvedObject"] == {"kind": "Pod", "apiVersion": "v1", "namespace": "ml",
                                           "name": "train-0", "uid": uid}
        assert event["source"]["component"] == "partkeeper"
    allocated, blocked, _, _ = recorded
    assert "1g.10gb" in allocated["message"] and MIG in allocated["message"]
    assert "in use after 3 attempt(s)" in blocked["message"]
    assert len(apiserver.events()) == len(recorded), "an entry naming no Pod recorded something"


async def test_the_same_fact_published_twice_records_one_event(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str
) -> None:
    await start_watcher(EVENTS_FAST)
    uid = await held(apiserver, js, node)
    active = claim("active", pod_uid=uid)
    await emit(js, node, active, "first")
    last = await emit(js, node, active, "second")  # another msg id: the stream keeps both
    await all_acknowledged(js, node, last)
    (event,) = ours(apiserver, uid)
    assert event["reason"] == "PartitionAllocated"


async def test_an_event_is_recorded_for_a_pod_already_gone(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str
) -> None:
    await start_watcher(EVENTS_FAST)
    uid = await held(apiserver, js, node, "done-7", "batch")
    apiserver.delete_pod("batch", "done-7", grace_period_seconds=0)  # before the reclaim ended
    await until(lambda: gone(js, node, uid), "the watcher's tombstone", DEADLINE)
    last = await emit(js, node, claim("removed", pod_uid=uid, namespace="batch", name="done-7",
                                      reason="instance destroyed"), "gone")
    await all_acknowledged(js, node, last)
    (event,) = ours(apiserver, uid)
    assert event["reason"] == "PartitionReclaimed"
    assert event["involvedObject"]["name"] == "done-7"


@pytest.mark.parametrize("payload", [
    b"{not json",
    b'{"v": 9, "type": "ClaimChanged"}',
    b'{"v": 1, "type": "ClaimChanged", "node": "n"}',
], ids=["not-json", "unknown-version", "missing-fields"])
async def test_an_undecodable_entry_is_dead_lettered(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str,
    payload: bytes,
) -> None:
    await start_watcher(EVENTS_FAST)
    ack = await js.publish(parts_subject(node, 0), payload)
    await all_acknowledged(js, node, ack.seq)
    dead = await js.get_last_msg(STREAM_DLQ, dlq_subject(node, SERVICE))
    assert dead.data == payload
    assert dead.headers is not None
    assert dead.headers["Pk-Original-Subject"] == parts_subject(node, 0)
    assert dead.headers["Pk-Error"]
    assert apiserver.events() == []


async def test_an_entry_naming_an_impossible_pod_is_dead_lettered(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str
) -> None:
    await start_watcher(EVENTS_FAST)
    last = await emit(js, node, claim("active", pod_uid="../../etc"),
                      "odd")
    await all_acknowledged(js, node, last)
    dead = await js.get_last_msg(STREAM_DLQ, dlq_subject(node, SERVICE))
    assert dead.headers is not None and "not a lowercase RFC 4122 UUID" in dead.headers["Pk-Error"]
    assert apiserver.events() == []


async def test_a_failed_create_is_retried_until_the_api_server_answers(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await start_watcher(dataclasses.replace(EVENTS_FAST, event_attempts=1000,
                                            event_retry_cap=0.1))
    uid = await held(apiserver, js, node)
    apiserver.set_unavailable(True)
    last = await emit(js, node, claim("active", pod_uid=uid), "r")
    await until(lambda: log_lines(caplog, "not recorded yet"), "a failed create", 20)
    apiserver.set_unavailable(False)
    await all_acknowledged(js, node, last)
    (event,) = ours(apiserver, uid)
    assert event["reason"] == "PartitionAllocated"


async def test_retries_are_bounded_and_the_entry_is_then_acknowledged(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await start_watcher(EVENTS_FAST)  # 4 deliveries
    uid = await held(apiserver, js, node)
    apiserver.set_unavailable(True)
    last = await emit(js, node, claim("active", pod_uid=uid), "b")
    await all_acknowledged(js, node, last)
    assert log_lines(caplog, "gave up after 4 attempts")
    apiserver.set_unavailable(False)
    assert ours(apiserver, uid) == []
    with pytest.raises(NotFoundError):  # an advisory Event is never dead-lettered
        await js.get_last_msg(STREAM_DLQ, dlq_subject(node, SERVICE))


async def test_an_entry_older_than_the_event_ttl_records_nothing(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str
) -> None:
    await start_watcher(EVENTS_FAST)
    uid = await held(apiserver, js, node)
    last = await emit(js, node, claim("active", pod_uid=uid), "old", age=2 * 3600)
    await all_acknowledged(js, node, last)
    assert ours(apiserver, uid) == []


async def test_no_event_on_a_pod_of_another_node_nor_from_another_services_subject(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str
) -> None:
    """What a service of this node says names a Pod: the watcher speaks only about Pods its own
    view holds on this node, and only from the subject of the service whose kind of entry it
    is. A refusal naming another node's Pod (as the GC once could, on the node-scope subject),
    a refusal on the GC's subject, and a transition of card 1 on card 0's subject record
    nothing, are acknowledged, and a real one afterwards still is recorded."""
    other = apiserver.create_pod(pod_manifest("victim", node=f"{node}-other"), namespace="ml")
    theirs = other["metadata"]["uid"]
    await start_watcher(EVENTS_FAST)
    uid = await held(apiserver, js, node)
    forged = [
        (parts_subject(node, None), refused(pod_uid=theirs, name="victim")),
        (parts_subject(node, None), refused(pod_uid=theirs, namespace="", name="")),
        (gc_parts_subject(node), refused(pod_uid=uid)),
        (parts_subject(node, 0), claim("active", pod_uid=uid, card=1)),
        # this node's Pod under another name: the names come from the view
        (parts_subject(node, None), refused(pod_uid=uid, name="someone-else")),
    ]
    for i, (subject, entry) in enumerate(forged):
        entry = msgspec.structs.replace(entry, node=node, at=time.time())
        await publish(js, subject, entry, msg_id=f"forged/{i}/{uuid.uuid4().hex}")
    last = await emit(js, node, refused(pod_uid=uid), "real")
    await all_acknowledged(js, node, last)
    assert ours(apiserver, theirs) == []
    assert [e["reason"] for e in ours(apiserver, uid)] == ["AllocateRefused"]
    assert len(apiserver.events()) == 1


async def test_a_failed_card_becomes_a_warning_on_its_pod_from_the_allocators_subject_only(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str
) -> None:
    """CardUnhealthy is the allocator's (its node-wide subject); the same entry on a card's
    subject, which the reclaimer may publish on, records nothing."""
    await start_watcher(EVENTS_FAST)
    uid = await held(apiserver, js, node)
    forged = msgspec.structs.replace(card_unhealthy(pod_uid=uid), node=node, at=time.time())
    await publish(js, parts_subject(node, 1), forged, msg_id=f"forged/{uuid.uuid4().hex}")
    entry = msgspec.structs.replace(card_unhealthy(pod_uid=uid), node=node, at=time.time())
    ack = await publish(js, parts_subject(node, None), entry, msg_id=f"real/{uuid.uuid4().hex}")
    await all_acknowledged(js, node, ack.seq)
    [event] = ours(apiserver, uid)
    assert (event["reason"], event["type"]) == ("PartitionCardUnhealthy", "Warning")
    assert "Card 1" in event["message"] and "XID 48" in event["message"]
    assert "double-bit ECC" in event["message"]


async def test_a_cards_health_is_noted_on_the_node_from_the_allocators_subject_only(
    apiserver: ApiServerThread, start_watcher: Any, js: JetStreamContext, node: str
) -> None:
    await asyncio.to_thread(apiserver.add_node, node, {})
    await start_watcher(EVENTS_FAST)
    key = CARD_HEALTH.format(index=1)

    def noted() -> str | None:
        return (apiserver.get_node(node)["metadata"].get("annotations") or {}).get(key)

    failed = CardHealthChanged(node=node, at=time.time(), card=1, health="failed",
                               cause="xid-48", meaning="double-bit ECC error")
    await publish(js, parts_subject(node, 1), failed, msg_id=f"forged/{uuid.uuid4().hex}")
    ack = await publish(js, parts_subject(node, None), failed, msg_id=f"f/{uuid.uuid4().hex}")
    await all_acknowledged(js, node, ack.seq)
    assert noted() == "failed: xid-48 (double-bit ECC error); takes no new partition"
    ok = msgspec.structs.replace(failed, health="ok", cause="", meaning="", at=time.time())
    ack = await publish(js, parts_subject(node, 1), ok, msg_id=f"forged/{uuid.uuid4().hex}")
    await all_acknowledged(js, node, ack.seq)
    assert noted() is not None  # a card's subject may not clear it
    ack = await publish(js, parts_subject(node, None), ok, msg_id=f"ok/{uuid.uuid4().hex}")
    await all_acknowledged(js, node, ack.seq)
    assert noted() is None
