"""The bus through a fault proxy (tests_support.faultproxy): lost acks, reset connections and a
black-holed route end nothing; a caller cut off gets no answer and acts on none."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import nats
import pytest
from nats.aio.client import Client

from partkeeper.bus import NoAnswer, publish, serve
from partkeeper.bus.clients import WatcherClient
from partkeeper.bus.consumer import Delivery
from partkeeper.bus.permissions import ADMIN, inbox_prefix
from partkeeper.bus.rpc import Endpoint
from partkeeper.lifecycle import cancel_all
from schemas import PodGone, PodsGet, PodsGetReply
from schemas.names import encode_token, pods_get_subject, pods_subject
from tests_support import until
from tests_support.bus import UID, gone, runner
from tests_support.faultproxy import FaultProxy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def proxy(nats_server):
    async with FaultProxy(nats_server.port) as p:
        yield p


async def connect(proxy: FaultProxy, node: str) -> Client:
    """Through the proxy, with `node`'s operators' inbox (the one the services answer)."""
    return await nats.connect(proxy.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                              ping_interval=1, max_outstanding_pings=2,
                              inbox_prefix=inbox_prefix(ADMIN, encode_token(node)))


def answers(client: WatcherClient, state: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            return (await client.pod(UID)).state == state
        except NoAnswer:
            return False

    return check


async def test_an_ack_that_times_out_is_redelivered_and_the_runner_goes_on(
    proxy: FaultProxy, js, node: str
) -> None:
    """nats-server unreachable just as the handler finishes: `ack_sync` times out. The runner
    logs it and carries on; the message comes back after ack_wait and is acknowledged then."""
    attempts: list[int] = []
    done = asyncio.Event()

    async def handle(event: PodGone, delivery: Delivery) -> None:
        attempts.append(delivery.attempt)
        if delivery.attempt == 1:
            proxy.black_hole()  # the ack that follows is lost
        else:
            done.set()

    await publish(js, pods_subject(node, UID), gone(node), msg_id=f"lost-ack/{node}")
    cut = await connect(proxy, node)
    r = runner(cut.jetstream(), node, handle, name="lostack")
    task = asyncio.create_task(r.run(fetch_timeout=0.5))
    try:
        await until(lambda: r.unsettled == 1, "the lost ack noticed", timeout=30)
        assert attempts == [1] and not task.done()
        proxy.heal()
        proxy.drop()  # the half-eaten connection is replaced
        async with asyncio.timeout(60):
            await done.wait()
        assert not task.done(), task
        await until(lambda: r.processed == 1, "the redelivery acknowledged")
    finally:
        await cancel_all([task])
        await cut.close()
    assert attempts == [1, 2]


async def test_micro_endpoint_answers_again_after_its_connection_is_reset(
    proxy: FaultProxy, nc: Client, node: str
) -> None:
    async def get(body: PodsGet) -> PodsGetReply:
        return PodsGetReply(uid=body.uid, state="live", evidence="watch")

    server_side = await connect(proxy, node)
    svc = await serve(server_side, name="pk-watcher", version="0.1.0", description="t",
                      endpoints=[Endpoint("pods-get", pods_get_subject(node), PodsGet, get)])
    client = WatcherClient(nc, node, timeout=0.5)
    try:
        assert (await client.pod(UID)).state == "live"
        proxy.drop()
        await until(answers(client, "live"), "pods.get answered after the reconnect", timeout=30)
    finally:
        await svc.stop()
        await server_side.close()


async def test_a_black_holed_caller_gets_no_answer_then_recovers(
    proxy: FaultProxy, nc: Client, node: str
) -> None:
    async def get(body: PodsGet) -> PodsGetReply:
        return PodsGetReply(uid=body.uid, state="gone", evidence="deleted")

    svc = await serve(nc, name="pk-watcher", version="0.1.0", description="t",
                      endpoints=[Endpoint("pods-get", pods_get_subject(node), PodsGet, get)])
    caller = await connect(proxy, node)
    client = WatcherClient(caller, node, timeout=0.5)
    try:
        assert (await client.pod(UID)).state == "gone"
        proxy.black_hole(half_open=True)
        with pytest.raises(NoAnswer):
            await client.pod(UID)  # fails closed: no verdict is made up
        proxy.heal()
        await until(answers(client, "gone"), "pods.get answered once the route is back",
                    timeout=30)
    finally:
        await svc.stop()
        await caller.close()
