"""The persisted view on a real nats-server: publish, then write with compare-and-set; a crash
or a second writer in between produces no duplicate effect (invariant 6); unreadable records
fail closed (invariant 9); tombstones are kept, then pruned."""

from __future__ import annotations

import logging
import uuid

import pytest
from nats.js import JetStreamContext

from partkeeper.bus import publish
from schemas import ContainerRequest, PodRecord, decode, encode
from schemas.names import BUCKET_PODS, DAY, STREAM_PODS, encode_token, pods_key, pods_subject
from schemas.pods import PodPhase
from services.watcher.decide import Deleted, Seen, decide, msg_id
from services.watcher.pods import PodFacts
from services.watcher.view import PodView


@pytest.fixture
def uid() -> str:
    # Msg ids name the Pod, not the node, and all the tests share one stream.
    return str(uuid.uuid4())


def facts(uid: str, rv: int, phase: PodPhase = "Pending") -> PodFacts:
    return PodFacts(uid=uid, namespace="ns", name="p", phase=phase,
                    deleting=False, created="2026-01-01T00:00:00Z",
                    containers=(ContainerRequest(name="main"),), resource_version=str(rv), rv=rv)


async def view_of(js: JetStreamContext, node: str, now: float = 1000.0) -> PodView:
    view = PodView(js, await js.key_value(BUCKET_PODS), node, clock=lambda: now)
    await view.load()
    return view


async def stored_count(js: JetStreamContext, node: str, uid: str) -> int:
    subject = pods_subject(node, uid)
    info = await js.stream_info(STREAM_PODS, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def test_the_event_is_published_and_the_record_persisted(
    js: JetStreamContext, node: str, uid: str
) -> None:
    view = await view_of(js, node)
    decision = await view.apply(Seen(facts(uid, 6), "watch ADDED"))
    assert decision.event is not None
    message = await js.get_last_msg(STREAM_PODS, pods_subject(node, uid))
    assert message.headers
    assert message.headers["Nats-Msg-Id"] == f"{encode_token(node)}/PodSeen/{uid}/6"
    entry = await (await js.key_value(BUCKET_PODS)).get(pods_key(node, uid))
    assert decode(entry.value or b"", PodRecord).state == "live"
    restarted = await view_of(js, node)
    record = restarted.get(uid)
    assert record is not None and record.resource_version == "6"


async def test_a_crash_between_publish_and_persist_replays_without_duplicate(
    js: JetStreamContext, node: str, uid: str
) -> None:
    """A previous incarnation published the fact and died before writing the record."""
    event = decide(node, None, Seen(facts(uid, 6), "list"), 1.0).event
    assert event is not None
    await publish(js, pods_subject(node, uid), event, msg_id=msg_id(event))
    view = await view_of(js, node)
    await view.apply(Seen(facts(uid, 6), "list"))
    assert await stored_count(js, node, uid) == 1
    assert view.get(uid) is not None


async def test_one_nodes_event_does_not_drop_anothers_about_the_same_uid(
    js: JetStreamContext, node: str, uid: str
) -> None:
    """The stream de-duplicates by id across every node: two nodes' watchers announcing the
    same fact about the same uid (a Pod record one of them should never have had, or one
    node's watcher replaying what it read) must both land, each on its own node's subject."""
    other = f"{node}-other"
    await (await view_of(js, other)).apply(Deleted(facts(uid, 7)))
    await (await view_of(js, node)).apply(Deleted(facts(uid, 7)))
    assert await stored_count(js, other, uid) == 1
    assert await stored_count(js, node, uid) == 1


async def test_a_second_writer_is_fenced_by_the_revision(
    js: JetStreamContext, node: str, uid: str
) -> None:
    first, second = await view_of(js, node), await view_of(js, node)
    await second.apply(Seen(facts(uid, 6), "list"))
    await second.apply(Deleted(facts(uid, 7)))
    # `first` still believes it has never seen the Pod; its write conflicts, it re-reads,
    # finds the tombstone and decides nothing.
    decision = await first.apply(Seen(facts(uid, 6), "list"))
    record = first.get(uid)
    assert record is not None and record.state == "gone"
    assert decision.record is None
    assert await stored_count(js, node, uid) == 2  # PodSeen and PodGone, once each


async def test_an_unreadable_record_fails_closed_and_is_overwritten(
    js: JetStreamContext, node: str, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    kv = await js.key_value(BUCKET_PODS)
    await kv.put(pods_key(node, uid), b'{"v": 99, "type": "PodRecord"}')
    with caplog.at_level(logging.ERROR):
        view = await view_of(js, node)
    assert view.get(uid) is None and view.records() == []
    assert any("unreadable Pod record" in r.getMessage() for r in caplog.records)
    await view.apply(Seen(facts(uid, 6), "list"))
    assert (await view_of(js, node)).get(uid) is not None


async def test_tombstones_answer_late_then_are_pruned_after_a_day(
    js: JetStreamContext, node: str, uid: str
) -> None:
    view = await view_of(js, node, now=1000.0)
    await view.apply(Deleted(facts(uid, 6)))
    assert await view.prune(DAY) == 0
    assert (record := view.get(uid)) is not None and record.state == "gone"
    later = await view_of(js, node, now=1000.0 + DAY + 1)
    other = PodRecord(node=node, uid="1c7f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b", namespace="ns",
                      name="q", phase="Running", state="live", resource_version="3",
                      updated_at=0)
    await (await js.key_value(BUCKET_PODS)).put(pods_key(node, other.uid), encode(other))
    await later.load()
    assert await later.prune(DAY) == 1
    assert later.get(uid) is None and later.get(other.uid) is not None  # live records stay
    assert (await view_of(js, node)).get(uid) is None
