"""The allocator's Pod view (services/allocator/core/podview.py): "loaded" means every record of the
node present at the start is in the view, then it follows changes; another node's records never
enter it."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid

import msgspec
from nats.aio.client import Client

from partkeeper.lifecycle import cancel_all
from schemas import ContainerRequest, PodRecord, encode
from schemas.names import BUCKET_PODS, pods_key
from services.allocator.core.podview import PodView
from tests_support import until


def record(node: str, i: int) -> PodRecord:
    return PodRecord(node=node, uid=str(uuid.uuid4()), namespace="pv", name=f"pod-{i}",
                     phase="Pending", state="live", created=f"{i:08d}",
                     containers=[ContainerRequest(name="main", requests={"r": 1})],
                     resource_version=str(i), updated_at=time.time())


async def test_the_view_is_loaded_with_every_record_present_at_the_start(nc: Client,
                                                                         node: str) -> None:
    bucket = await nc.jetstream().key_value(BUCKET_PODS)
    mine = [record(node, i) for i in range(200)]
    for pod in [*mine, record(f"{node}-other", 0)]:
        await bucket.put(pods_key(pod.node, pod.uid), encode(pod))
    await bucket.delete(pods_key(node, mine[0].uid))
    loaded = asyncio.Event()
    view = PodView(nc, node, lambda: None)
    task = asyncio.create_task(view.run(loaded))
    try:
        await asyncio.wait_for(loaded.wait(), 20)
        assert len(view.records) == 199  # all of them, the deleted one left out
        assert view.state(mine[0].uid) is None and view.state(mine[1].uid) == "live"
        later = record(node, 200)
        await bucket.put(pods_key(node, later.uid), encode(later))
        await until(lambda: view.record(later.uid) == later, "the record written after")
        await bucket.delete(pods_key(node, later.uid))
        await until(lambda: view.state(later.uid) is None, "the deleted record gone")
        assert view.skipped == 0
    finally:
        await cancel_all([task])


def seen(view: PodView, pod: PodRecord) -> bool:
    return view.record(pod.uid) == pod


async def test_only_a_change_of_whether_a_pod_is_dead_wakes_the_recompute(nc: Client,
                                                                          node: str) -> None:
    bucket = await nc.jetstream().key_value(BUCKET_PODS)
    loaded = asyncio.Event()
    wakes: list[str] = []
    view = PodView(nc, node, lambda: wakes.append("touch"))
    task = asyncio.create_task(view.run(loaded))
    try:
        await asyncio.wait_for(loaded.wait(), 20)
        wakes.clear()  # the replay's end wakes it once
        pod = record(node, 1)
        running = msgspec.structs.replace(pod, phase="Running", resource_version="2")
        finished = msgspec.structs.replace(running, phase="Succeeded", state="finished",
                                           resource_version="3")
        for quiet in (pod, running):  # a new pending Pod, then Running: no list changes
            await bucket.put(pods_key(node, pod.uid), encode(quiet))
            await until(functools.partial(seen, view, quiet), f"{quiet.phase} seen")
        assert wakes == []
        await bucket.put(pods_key(node, pod.uid), encode(finished))
        await until(lambda: wakes == ["touch"], "the Pod's end wakes the recompute")
        await bucket.delete(pods_key(node, pod.uid))  # dead -> unknown is a change too
        await until(lambda: wakes == ["touch", "touch"], "the record's expiry wakes it")
    finally:
        await cancel_all([task])
