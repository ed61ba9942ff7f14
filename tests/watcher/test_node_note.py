"""The watcher labels its Node with whether logical slices are enforced (PK_SLICE_LIMITER),
through the real client against the simulated API server; a Node that is not there yet is
retried, not given up on."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Literal

import pytest

from partkeeper.config import Config
from partkeeper_sim.apiserver import ApiServerThread
from services.watcher import node_note
from services.watcher.kube import Kube
from tests_support import until


@pytest.mark.parametrize(("limiter", "label"), [("none", "false"), ("hami-core", "true")])
async def test_the_node_says_whether_slices_are_enforced(
    apiserver: ApiServerThread, watcher_config: Config, limiter: Literal["none", "hami-core"],
    label: str,
) -> None:
    config = replace(watcher_config, slice_limiter=limiter)
    kube = await Kube.connect(config)
    task = asyncio.create_task(node_note.keep(kube, config.slice_limiter, period=0.05))
    try:
        await asyncio.sleep(0)  # the first patch finds no Node: a 404 it retries
        await asyncio.to_thread(apiserver.add_node, config.node, {"other": "kept"})

        def labelled() -> bool:
            meta = apiserver.get_node(config.node)["metadata"]
            return (meta.get("labels") or {}).get(node_note.LABEL) == label

        await until(labelled, "the Node carries the slice-enforcement label", 15)
        meta = apiserver.get_node(config.node)["metadata"]
        assert meta["labels"]["other"] == "kept"  # a merge patch: nothing else touched
        said = meta["annotations"][node_note.ANNOTATION]
        assert ("NOT enforced" in said) == (limiter == "none")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(kube.close)
