"""The allocator's Pod view (services/allocator/podview.py): "loaded" means every record of the
node present at the start is in the view, then it follows changes; another node's records never
enter it."""

from __future__ import annotations

import asyncio
import time
import uuid

from nats.aio.client import Client

from partkeeper.lifecycle import cancel_all
from schemas import ContainerRequest, PodRecord, encode
from schemas.names import BUCKET_PODS, pods_key
from services.allocator.podview import PodView
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
