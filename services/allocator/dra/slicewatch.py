"""Watching the node's own ResourceSlices, so a slice somebody else changed is published again.

Kubelet deletes every ResourceSlice of its node when it starts and a driver's slices after its
plugin has been unusable for 30 s; an administrator may delete or edit one. The upstream
`resourceslice` controller (k8s.io/dynamic-resource-allocation/resourceslice,
resourceslicecontroller.go) runs an informer on the slices of its driver and node and syncs the
pool on every event; this is the same with the one list-watch (`partkeeper.listwatch`).

An event is ours when it shows a slice as the publisher last sent it (same content and pool
generation; the body is recorded before the write, so the event may come before the answer)
or the deletion of a slice the publisher no longer intends; anything else marks the publisher
stale and wakes it. A LIST (at start, after an expired or failed watch) always
does: what happened while nobody watched is unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from partkeeper.dra import slices
from partkeeper.listwatch import Listed, ListWatch, follow
from services.allocator.dra.kube import Item, KubeError, ResourceApi
from services.allocator.dra.publish import SlicePublisher

log = logging.getLogger(__name__)

WATCH_TIMEOUT_SECONDS = 240


def foreign(event_type: str, obj: Any, intended: Mapping[str, dict[str, Any]]) -> bool:
    """Whether a watch event shows a change to our slices that the publisher did not make."""
    if event_type not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj, dict):
        return False
    name = str((obj.get("metadata") or {}).get("name"))
    sent = intended.get(name)
    if event_type == "DELETED":
        return sent is not None
    if sent is None:
        return True
    return (_generation(obj) != _generation(sent)
            or slices.content([obj])[name] != slices.content([sent])[name])


def _generation(obj: dict[str, Any]) -> Any:
    return ((obj.get("spec") or {}).get("pool") or {}).get("generation")


class SliceWatch:
    def __init__(self, api: ResourceApi, publisher: SlicePublisher) -> None:
        self.api = api
        self.publisher = publisher
        self.noticed = 0  # foreign changes seen (tests, bench)
        self._listwatch: ListWatch[list[dict[str, Any]]] = ListWatch(
            api.list_slices_at, api.watch_slices, timeout_seconds=WATCH_TIMEOUT_SECONDS)

    def stop(self) -> None:
        self._listwatch.stop()

    async def run(self) -> None:
        await follow("watching the node's ResourceSlices", self._listwatch, self._take,
                     failing=(KubeError,))

    def _take(self, item: Item) -> None:
        if isinstance(item, Listed):
            self.publisher.invalidate()
            return
        if foreign(item.type, item.object, self.publisher.intended):
            self.noticed += 1
            name = (item.object.get("metadata") or {}).get("name")
            log.info("ResourceSlice %s was %s by someone else; publishing again", name,
                     item.type.lower())
            self.publisher.invalidate()
