"""The watcher as a process (`python -m services.watcher`), stopped and killed, then restarted:
nothing is forgotten and nothing announced twice (invariant 6)."""

from __future__ import annotations

from typing import Any

from partkeeper.faults import EXIT_STATUS
from partkeeper_sim.apiserver import ApiServerThread
from schemas import PodGone
from tests_support.kubeclient import pod_manifest
from tests_support.watcher import Published

DEADLINE = 20.0


async def test_a_pod_deleted_while_the_watcher_was_down_is_announced_gone_after_restart(
    apiserver: ApiServerThread, watcher_process: Any, published: Published, node: str
) -> None:
    doomed = apiserver.create_pod(pod_manifest("doomed", node=node))["metadata"]["uid"]
    stays = apiserver.create_pod(pod_manifest("stays", node=node))["metadata"]["uid"]
    first = await watcher_process()
    await published.wait_for(doomed, "PodSeen", timeout=DEADLINE)
    await published.wait_for(stays, "PodSeen", timeout=DEADLINE)
    assert await first.terminate() == 0
    apiserver.delete_pod("default", "doomed", grace_period_seconds=0)
    second = await watcher_process()
    await published.wait_for(doomed, "PodGone", timeout=DEADLINE)
    (gone,) = published.of(doomed, "PodGone")
    assert isinstance(gone, PodGone) and gone.evidence == "relist"
    # The relist applies the listed Pods before the absent ones: "stays" was re-observed by now,
    # and the persisted view made that a no-op.
    assert len(published.of(stays)) == 1
    assert await second.terminate() == 0


async def test_killed_before_each_publish_the_restart_publishes_each_fact_once(
    apiserver: ApiServerThread, watcher_process: Any, published: Published, node: str
) -> None:
    uid = apiserver.create_pod(pod_manifest("a", node=node))["metadata"]["uid"]
    crashing = await watcher_process(PK_FAULTS="watcher.before_publish=exit")
    assert await crashing.exited() == EXIT_STATUS
    assert not published.events
    healthy = await watcher_process()
    await published.wait_for(uid, "PodSeen", timeout=DEADLINE)
    assert await healthy.terminate() == 0
    apiserver.delete_pod("default", "a", grace_period_seconds=0)
    crashing = await watcher_process(PK_FAULTS="watcher.before_publish=exit")
    assert await crashing.exited() == EXIT_STATUS
    healthy = await watcher_process()
    await published.wait_for(uid, "PodGone", timeout=DEADLINE)
    assert [type(e).__name__ for e in published.of(uid)] == ["PodSeen", "PodGone"]
    assert await healthy.terminate() == 0
