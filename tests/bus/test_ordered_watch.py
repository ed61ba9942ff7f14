"""The ordered watch (bus/ordered.py) and the KV watch over it (bus/kv.py) on a real nats-server:
the end of the replay comes after every entry present at the start, and a consumer that is
deleted or lost with a server restart is replaced under a new name, the reader seeing every
message once, in order."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js import api

from partkeeper.bus import ensure_topology, kv
from partkeeper.bus.ordered import OrderedWatch
from partkeeper.lifecycle import cancel_all
from partkeeper_sim.stack.natsserver import NatsServer
from schemas.names import BUCKET_CLAIMS, STREAM_PARTITIONS, claims_prefix, parts_filter
from tests_support import until
from tests_support.watches import FAST, Reader

pytestmark = pytest.mark.timeout(90)

def a_node() -> str:
    return f"watch-{uuid.uuid4().hex[:8]}"


async def _publish(nc: Client, subject: str, values: range) -> list[int]:
    js = nc.jetstream()
    return [(await js.publish(subject, str(i).encode())).seq for i in values]


async def test_the_replay_ends_after_every_entry_present_at_the_start(nc: Client) -> None:
    node = a_node()
    bucket = await nc.jetstream().key_value(BUCKET_CLAIMS)
    keys = [f"{claims_prefix(node)}{i}" for i in range(300)]
    for key in keys:
        await bucket.put(key, b"x")
    await bucket.delete(keys[0])
    before: list[object] = []
    async with contextlib.aclosing(kv.watch(nc, BUCKET_CLAIMS, f"{claims_prefix(node)}*",
                                            meta_only=True)) as entries:
        async for entry in entries:
            if entry is None:
                break
            before.append(entry)
        assert {e.key for e in before} == set(keys)  # type: ignore[attr-defined]
        deleted = [e for e in before if e.operation == "DEL"]  # type: ignore[attr-defined]
        assert [e.key for e in deleted] == [keys[0]]  # type: ignore[attr-defined]
        await bucket.put(keys[1], b"y")
        after = await anext(entries)
        assert after is not None and after.key == keys[1] and after.value == b""


async def test_a_watch_works_beside_the_previous_versions_watch_of_the_same_keys(
        nc: Client) -> None:
    """A rolling upgrade: the bucket and its records as the previous version left them, and its
    allocator's nats-py KV watch (an unnamed consumer) still open on the same keys."""
    node = a_node()
    bucket = await nc.jetstream().key_value(BUCKET_CLAIMS)
    for card in range(3):
        await bucket.put(f"{claims_prefix(node)}{card}", b"old")
    previous = await bucket.watch(f"{claims_prefix(node)}*")
    try:
        seen = []
        async with contextlib.aclosing(kv.watch(nc, BUCKET_CLAIMS,
                                                f"{claims_prefix(node)}*")) as entries:
            async for entry in entries:
                if entry is None:
                    break
                seen.append((entry.key, entry.value))
        assert seen == [(f"{claims_prefix(node)}{c}", b"old") for c in range(3)]
    finally:
        await previous.stop()


async def test_an_empty_replay_ends_at_once_and_a_start_at_new_skips_the_past(nc: Client) -> None:
    node = a_node()
    await _publish(nc, f"pk.parts.{node}.0", range(3))
    reader = Reader(OrderedWatch(nc, STREAM_PARTITIONS, parts_filter(node),
                                 deliver=api.DeliverPolicy.NEW, **FAST))
    try:
        await asyncio.wait_for(reader.caught_up.wait(), 10)
        sent = await _publish(nc, f"pk.parts.{node}.0", range(3, 6))
        await until(lambda: len(reader.msgs) >= 3, "the new entries")
        assert reader.sequences == sent
    finally:
        await cancel_all([reader.task])


async def test_a_deleted_consumer_is_replaced_under_a_new_name_with_no_gap_nor_duplicate(
        nc: Client) -> None:
    node = a_node()
    subject = f"pk.parts.{node}.0"
    sent = await _publish(nc, subject, range(5))
    reader = Reader(OrderedWatch(nc, STREAM_PARTITIONS, parts_filter(node), **FAST))
    try:
        await until(lambda: len(reader.msgs) >= 5, "the first entries")
        first = reader.watch.name
        assert first is not None
        await nc.jetstream().delete_consumer(STREAM_PARTITIONS, first)
        sent += await _publish(nc, subject, range(5, 10))  # while no consumer delivers
        await until(lambda: len(reader.msgs) >= 10, "the entries after the reset")
        sent += await _publish(nc, subject, range(10, 12))
        await until(lambda: len(reader.msgs) >= 12, "the entries after that")
        assert reader.sequences == sent
        assert reader.data == [str(i).encode() for i in range(12)]
        assert reader.watch.resets >= 1 and reader.watch.name != first
    finally:
        await cancel_all([reader.task])


@pytest.fixture
async def own_server() -> AsyncIterator[NatsServer]:
    server = NatsServer().start()
    admin = await nats.connect(server.url)
    try:
        await ensure_topology(admin.jetstream())
    finally:
        await admin.close()
    yield server
    server.stop()
    shutil.rmtree(server.store_dir, ignore_errors=True)


async def test_a_server_restart_loses_no_entry_and_repeats_none(own_server: NatsServer) -> None:
    node = a_node()
    subject = f"pk.parts.{node}.0"
    nc = await nats.connect(own_server.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1)
    try:
        reader = Reader(OrderedWatch(nc, STREAM_PARTITIONS, parts_filter(node),
                                     deliver=api.DeliverPolicy.NEW, **FAST))
        try:
            await asyncio.wait_for(reader.caught_up.wait(), 10)
            sent = await _publish(nc, subject, range(4))
            await until(lambda: len(reader.msgs) >= 4, "the entries before the restart")
            await asyncio.to_thread(own_server.restart)
            await until(lambda: nc.is_connected, "the reconnection", 20)
            sent += await _publish(nc, subject, range(4, 8))
            await until(lambda: len(reader.msgs) >= 8, "the entries after the restart", 20)
            assert reader.sequences == sent
            assert reader.data == [str(i).encode() for i in range(8)]
        finally:
            await cancel_all([reader.task])
    finally:
        await nc.close()


async def test_a_watch_that_stops_leaves_no_consumer_behind(nc: Client) -> None:
    """Nothing deletes the consumer (no delete grant): the server removes it once nobody has
    listened for its inactive threshold, as it does for a dead allocator's."""
    node = a_node()
    reader = Reader(OrderedWatch(nc, STREAM_PARTITIONS, parts_filter(node), **FAST))
    await asyncio.wait_for(reader.caught_up.wait(), 10)

    async def consumers() -> list[str]:
        infos = await nc.jetstream().consumers_info(STREAM_PARTITIONS)
        return [i.name for i in infos if i.config.filter_subject == parts_filter(node)]

    async def none_left() -> bool:
        return not await consumers()

    assert await consumers() == [reader.watch.name]
    await cancel_all([reader.task])
    await until(none_left, "the consumer removed by the server", 20)


async def test_a_replay_larger_than_the_flow_control_window_comes_whole(nc: Client) -> None:
    """Several megabytes pending: the server asks for flow-control answers on the way (push
    consumers with flow control, nats-server consumer.go `sendFlowControl`); unanswered, it
    would stall the replay."""
    js = nc.jetstream()
    stream = f"T_{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    try:
        payload = b"x" * 128 * 1024
        sent = [(await js.publish(f"{stream.lower()}.a", payload)).seq for _ in range(64)]
        reader = Reader(OrderedWatch(nc, stream, f"{stream.lower()}.>", **FAST))
        try:
            await asyncio.wait_for(reader.caught_up.wait(), 30)
            assert reader.sequences == sent
        finally:
            await cancel_all([reader.task])
    finally:
        await js.delete_stream(stream)


async def test_deliveries_dropped_behind_a_slow_reader_are_a_gap_the_watch_resets_for(
        nc: Client) -> None:
    """A reader that falls more than `pending` deliveries behind: nats-py drops the rest (a slow
    consumer, nats/aio/subscription.py), so the consumer sequence jumps; the watch resets under
    a new name after the last message it handed out, and the reader still sees each message
    once, in order."""
    js = nc.jetstream()
    stream = f"T_{uuid.uuid4().hex[:8]}"
    subject = f"{stream.lower()}.a"
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    watch = OrderedWatch(nc, stream, f"{stream.lower()}.>", pending=8, **FAST)
    try:
        assert await anext(watch) is None  # the empty replay is over: the reader now rests
        first = watch.name
        sent = await _publish(nc, subject, range(100))
        # Let the deliveries pile up past the subscription's limit before anything is read.
        await until(lambda: watch._sub is not None and watch._sub.pending_msgs >= 8,
                    "deliveries waiting past the limit")
        got: list[int] = []
        while len(got) < len(sent):
            msg = await asyncio.wait_for(anext(watch), 20)
            if msg is not None:
                got.append(msg.metadata.sequence.stream)
        assert got == sent
        assert watch.resets >= 1 and watch.name != first
    finally:
        await watch.stop()
        await js.delete_stream(stream)
