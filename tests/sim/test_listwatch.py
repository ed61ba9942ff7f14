"""partkeeper.listwatch against the simulated API server, through the real kubernetes client:
LIST then WATCH, the resume point, 410, lines that are not JSON, stopping."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from kubernetes import client

from partkeeper.listwatch import Event, Expired, Listed, ListWatch
from partkeeper_sim.apiserver import ApiServerThread
from tests_support import until
from tests_support.kubeclient import pod_manifest

DEADLINE = 10.0


def listwatch(core: client.CoreV1Api) -> ListWatch[list[str]]:
    async def names() -> tuple[str, list[str]]:
        resp = await asyncio.to_thread(core.list_namespaced_pod, "default",
                                       _preload_content=False)
        body = json.loads(resp.data)
        return body["metadata"]["resourceVersion"], [i["metadata"]["name"] for i in body["items"]]

    def watch(**kwargs: Any) -> Any:
        return core.list_namespaced_pod("default", **kwargs)

    return ListWatch(names, watch, timeout_seconds=30)


@contextlib.asynccontextmanager
async def watching(
    core: client.CoreV1Api, apiserver: ApiServerThread
) -> AsyncIterator[tuple[ListWatch[list[str]], asyncio.Future[Any]]]:
    """A list-watch whose LIST was taken and whose next item waits on the open watch."""
    lw = listwatch(core)
    async with contextlib.aclosing(lw.items()) as items:
        assert isinstance(await anext(items), Listed)
        pending = asyncio.ensure_future(anext(items))
        await until(lambda: apiserver.open_watches() == 1, "the watch to open", DEADLINE)
        yield lw, pending


def added(item: Listed[list[str]] | Event) -> str | None:
    if isinstance(item, Event) and item.type == "ADDED":
        return str(item.object["metadata"]["name"])
    return None


async def test_lists_then_watches_and_resumes_past_what_was_taken(
    core: client.CoreV1Api, apiserver: ApiServerThread
) -> None:
    core.create_namespaced_pod("default", pod_manifest("a"))
    lw = listwatch(core)
    async with contextlib.aclosing(lw.items()) as items:
        first = await anext(items)
        assert isinstance(first, Listed) and first.value == ["a"]
        assert lw.resume_from is None  # moved only once the LIST was taken
        core.create_namespaced_pod("default", pod_manifest("b"))  # after the LIST's version
        second = await asyncio.wait_for(anext(items), DEADLINE)
        assert added(second) == "b"
        assert lw.resume_from == first.resource_version  # b is being handled: not past it yet
        core.create_namespaced_pod("default", pod_manifest("c"))
        third = await asyncio.wait_for(anext(items), DEADLINE)
        assert added(third) == "c"
        assert isinstance(second, Event)
        assert lw.resume_from == second.object["metadata"]["resourceVersion"]


async def test_a_lost_history_raises_expired_and_the_next_pass_lists_again(
    core: client.CoreV1Api, apiserver: ApiServerThread
) -> None:
    old = core.create_namespaced_pod("default", pod_manifest("a")).metadata.resource_version
    core.create_namespaced_pod("default", pod_manifest("b"))
    apiserver.compact()
    lw = listwatch(core)
    lw.resume_from = old
    async with contextlib.aclosing(lw.items()) as items:
        try:
            await asyncio.wait_for(anext(items), DEADLINE)
        except Expired:
            pass
        else:
            raise AssertionError("a watch from a compacted version must raise Expired")
    assert lw.resume_from is None
    async with contextlib.aclosing(lw.items()) as items:
        relisted = await asyncio.wait_for(anext(items), DEADLINE)
    assert isinstance(relisted, Listed) and relisted.value == ["a", "b"]


async def test_a_line_that_is_not_json_is_an_event_without_content(
    core: client.CoreV1Api, apiserver: ApiServerThread
) -> None:
    async with watching(core, apiserver) as (_, next_item):
        assert apiserver.send_raw_watch_line("pods", "this is not json") == 1
        event = await asyncio.wait_for(next_item, DEADLINE)
    assert isinstance(event, Event) and event.raw is None and event.type == ""


async def test_leaving_the_iteration_stops_the_watch_request(
    core: client.CoreV1Api, apiserver: ApiServerThread
) -> None:
    async with watching(core, apiserver) as (lw, next_item):
        next_item.cancel()
        await asyncio.gather(next_item, return_exceptions=True)
    await until(lambda: apiserver.open_watches() == 0, "the watch to be closed", DEADLINE)
    for thread in list(lw.threads):
        await asyncio.to_thread(thread.join, DEADLINE)
        assert not thread.is_alive()
