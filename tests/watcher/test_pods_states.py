"""`pods.states`: the watcher's `pods.get` answers for many Pods in one round trip (the GC's
sweep asks it; services/watcher/states.py). Same answers as `pods.get`, in the order asked,
never guessing, and one LIST for all the UIDs it has never seen."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from partkeeper.bus import request
from partkeeper.bus.rpc import RemoteError
from partkeeper_sim.apiserver import ApiServerThread
from schemas import PodsGet, PodsGetReply, PodsStates, PodsStatesReply
from schemas.names import pods_get_subject, pods_states_subject
from schemas.rpc import PODS_STATES_MAX
from tests_support.kubeclient import pod_manifest
from tests_support.watcher import Published


async def states(nc: Client, node: str, uids: list[str]) -> PodsStatesReply:
    return await request(nc, pods_states_subject(node), PodsStates(uids=uids), PodsStatesReply,
                         timeout=10)


async def test_pods_states_answers_as_pods_get_does_in_the_order_asked(
    apiserver: ApiServerThread, start_watcher: Any, published: Published, nc: Client, node: str
) -> None:
    live = apiserver.create_pod(pod_manifest("a", node=node))["metadata"]["uid"]
    gone = apiserver.create_pod(pod_manifest("b", node=node))["metadata"]["uid"]
    await start_watcher()
    await published.wait_for(gone, "PodSeen")
    apiserver.delete_pod("default", "b", grace_period_seconds=0)
    await published.wait_for(gone, "PodGone")
    stranger = str(uuid.uuid4())
    asked = [stranger, gone, "../../etc/passwd", live]

    reply = await states(nc, node, asked)
    assert [p.uid for p in reply.pods] == asked
    by_uid = {p.uid: p for p in reply.pods}
    assert (by_uid[live].state, by_uid[gone].state) == ("live", "gone")
    assert by_uid[stranger].state == "unknown" and "not among the Pods" in by_uid[stranger].evidence
    assert by_uid["../../etc/passwd"].state == "unknown"
    assert all(p.pod is None for p in reply.pods), "a batch carries no Pod records"
    for uid in (live, gone, stranger):
        one = await request(nc, pods_get_subject(node), PodsGet(uid=uid), PodsGetReply, timeout=10)
        assert one.state == by_uid[uid].state


async def test_pods_states_refuses_an_oversized_batch(
    apiserver: ApiServerThread, start_watcher: Any, nc: Client, node: str
) -> None:
    await start_watcher()
    too_many = [str(uuid.uuid4()) for _ in range(PODS_STATES_MAX + 1)]
    body = msgspec.json.encode({"type": "PodsStates", "v": 1, "uids": too_many})
    msg = await nc.request(pods_states_subject(node), body, timeout=10)
    assert msg.headers and msg.headers.get("Nats-Service-Error-Code") == "400"
    with pytest.raises(RemoteError):
        await states(nc, node, too_many)
