"""The bus against a real nats-server: dedup, redelivery, dead letters, CAS, no responders."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
from nats.js.errors import KeyWrongLastSequenceError
from prometheus_client import REGISTRY

from partkeeper.bus import ConsumerRunner, NoAnswer, Permanent, Retry, publish, request, serve
from partkeeper.bus.consumer import Delivery
from partkeeper.bus.rpc import Endpoint, RemoteError
from schemas import PodGone, PodsGet, PodsGetReply
from schemas.names import (
    STREAM_DLQ,
    STREAM_PODS,
    ConsumerSpec,
    dlq_subject,
    pods_get_subject,
    pods_subject,
)
from tests_support import until
from tests_support.bus import UID, gone, runner


async def run_until(r: ConsumerRunner, done: asyncio.Event, timeout: float = 20) -> None:
    task = asyncio.create_task(r.run(fetch_timeout=0.5))
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_same_msg_id_is_stored_once(js, node: str) -> None:
    subject = pods_subject(node, UID)
    first = await publish(js, subject, gone(node), msg_id=f"gone/{UID}")
    second = await publish(js, subject, gone(node), msg_id=f"gone/{UID}")
    assert second.duplicate and second.seq == first.seq
    info = await js.stream_info(STREAM_PODS, subjects_filter=subject)
    assert info.state.subjects == {subject: 1}


async def test_publish_carries_traceparent(js, node: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("x") as span:
        await publish(js, pods_subject(node, UID), gone(node), msg_id=f"tp/{node}")
        trace_id = format(span.get_span_context().trace_id, "032x")
    msg = await js.get_last_msg(STREAM_PODS, pods_subject(node, UID))
    assert trace_id in msg.headers["traceparent"]
    assert trace is not None


async def test_retry_redelivers_then_acks(js, node: str) -> None:
    attempts: list[int] = []
    done = asyncio.Event()

    async def handle(event: PodGone, delivery: Delivery) -> None:
        attempts.append(delivery.attempt)
        if delivery.attempt == 1:
            raise Retry("store not reachable yet", delay=0.05)
        done.set()

    await publish(js, pods_subject(node, UID), gone(node), msg_id=f"r/{node}")
    r = runner(js, node, handle)
    task = asyncio.create_task(r.run(fetch_timeout=0.5))
    try:
        await asyncio.wait_for(done.wait(), 20)

        async def acked() -> bool:
            info = await js.consumer_info(STREAM_PODS, r.durable)
            return info.num_ack_pending == 0 and info.num_pending == 0

        await until(acked, "the message acknowledged")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert attempts == [1, 2]
    assert REGISTRY.get_sample_value("partkeeper_redeliveries_total",
                                     {"consumer": r.durable}) == 1


async def test_poison_message_is_dead_lettered_with_reason(js, nc, node: str) -> None:
    done = asyncio.Event()
    handled: list[object] = []

    async def handle(event: PodGone, delivery: Delivery) -> None:
        handled.append(event)

    await js.publish(pods_subject(node, UID), b'{"v": 7, "type": "PodGone"}')
    r = runner(js, node, handle)
    r.on_dead_letter = lambda error: done.set()
    await run_until(r, done)
    assert handled == []
    dead = await js.get_last_msg(STREAM_DLQ, dlq_subject(node, "t"))
    assert dead.headers["Pk-Original-Subject"] == pods_subject(node, UID)
    assert "schema version 7" in dead.headers["Pk-Error"]
    assert dead.data == b'{"v": 7, "type": "PodGone"}'
    assert await r.dlq_depth() == 1  # what partkeeper_dead_letter_messages reports


async def test_permanent_failure_and_exhausted_retries_dead_letter(js, node: str) -> None:
    done = asyncio.Event()
    seen: list[str] = []

    async def handle(event: PodGone, delivery: Delivery) -> None:
        if event.uid == UID:
            raise Permanent("claim document names another node")
        raise Retry("never works", delay=0.01)

    other = "1b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
    await publish(js, pods_subject(node, UID), gone(node), msg_id=f"p1/{node}")
    await publish(js, pods_subject(node, other), gone(node, other), msg_id=f"p2/{node}")
    r = runner(js, node, handle)

    def dead(error: str) -> None:
        seen.append(error)
        if len(seen) == 2:
            done.set()

    r.on_dead_letter = dead
    await run_until(r, done)
    assert "another node" in seen[0]
    assert "never works (after 3 deliveries)" in seen[1]


async def test_redelivered_after_handler_process_dies(js, nats_server, node: str) -> None:
    """A consumer process that dies before acking loses nothing: the next one gets the message."""
    subject = pods_subject(node, UID)
    await publish(js, subject, gone(node), msg_id=f"die/{node}")
    done = asyncio.Event()
    attempts: list[int] = []

    async def handle(event: PodGone, delivery: Delivery) -> None:
        attempts.append(delivery.attempt)
        done.set()

    r = runner(js, node, handle, spec=ConsumerSpec(ack_wait_seconds=1, max_deliver=5))
    await r.ensure()
    script = textwrap.dedent(
        f"""
        import asyncio, os, nats
        async def main():
            nc = await nats.connect({nats_server.url!r})
            js = nc.jetstream()
            sub = await js.pull_subscribe_bind(durable={r.durable!r}, stream="PK_PODS")
            msgs = await sub.fetch(1, timeout=10)
            assert msgs, "no message"
            os._exit(3)  # dies mid-handling, before any ack
        asyncio.run(main())
        """
    )
    proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", script], timeout=60)
    assert proc.returncode == 3
    await run_until(r, done)
    assert attempts == [2]


async def test_request_with_no_responders_fails_closed(nc, node: str) -> None:
    with pytest.raises(NoAnswer):
        await request(nc, pods_get_subject(node), PodsGet(uid=UID), PodsGetReply, timeout=1)


async def test_micro_service_answers_and_refuses_bad_requests(nc, node: str) -> None:
    async def get(body: PodsGet) -> PodsGetReply:
        return PodsGetReply(uid=body.uid, state="live", evidence="watch", resource_version="9")

    svc = await serve(
        nc, name="pk-watcher", version="0.1.0", description="t",
        endpoints=[Endpoint("pods-get", pods_get_subject(node), PodsGet, get)],
    )
    try:
        reply = await request(nc, pods_get_subject(node), PodsGet(uid=UID), PodsGetReply)
        assert reply.state == "live" and reply.resource_version == "9"
        with pytest.raises(RemoteError, match="400"):
            await request(nc, pods_get_subject(node), gone(node), PodsGetReply)
    finally:
        await svc.stop()


async def test_kv_compare_and_set_conflict(js, node: str) -> None:
    kv = await js.key_value("pk-claims")
    key = f"{node.replace('.', '_')}.cas"
    rev = await kv.create(key, b"a")
    await kv.update(key, b"b", last=rev)
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.update(key, b"c", last=rev)
    assert (await kv.get(key)).value == b"b"
