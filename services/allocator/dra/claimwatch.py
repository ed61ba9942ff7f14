"""Watching ResourceClaims, so the end of a claim's use wakes the claim lifetimes (ends.py).

A prepared claim's partition is released once its ResourceClaim is deleted or deallocated from
this node (ends.py says when); nothing tells the allocator of either but the API server. This
list-watch (`partkeeper.listwatch`, resuming from the last resourceVersion, listing afresh after
a 410) wakes `ClaimEnds` at each event of a claim it holds a partition for, and at each LIST
(what happened while nobody watched is unknown). The decision itself is still taken on a fresh
GET (ends.py): an event only says when to look, so an event that is late or lost delays a
release, never causes one. While the watch is down, `ClaimEnds` polls with backoff as before.

A ResourceClaim can be selected only by name and namespace (the API server's field selectors
for the kind), so every node watches all of them: one event per claim change per node, the cost
docs/dra.md states.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from partkeeper.listwatch import Listed, ListWatch, follow
from services.allocator.dra.kube import Item, KubeError, ResourceApi

log = logging.getLogger(__name__)

WATCH_TIMEOUT_SECONDS = 240


def concerns(item: Item, held: Collection[str]) -> bool:
    """Whether a LIST or a watch event may end the use of a claim in `held` (UIDs)."""
    if isinstance(item, Listed):
        return True
    if item.type not in ("MODIFIED", "DELETED") or not isinstance(item.object, dict):
        return False  # ADDED is a claim's start; BOOKMARK and ERROR name no claim
    return (item.object.get("metadata") or {}).get("uid") in held


class ClaimWatch:
    def __init__(self, api: ResourceApi, held: Callable[[], Collection[str]],
                 wake: Callable[[], None], seen: Callable[[Item], None] = lambda _: None) -> None:
        self.held = held  # the ResourceClaim UIDs the store holds partitions for
        self.wake = wake
        self.seen = seen  # every LIST and event, for who uses which claim (users.py)
        self.synced = False  # listed and watching: the lifetimes may wait for it to wake them
        self.woken = 0  # wake-ups given (tests, bench)
        self._listwatch: ListWatch[list[dict[str, Any]]] = ListWatch(
            api.list_claims_at, api.watch_claims, timeout_seconds=WATCH_TIMEOUT_SECONDS)

    def stop(self) -> None:
        self._listwatch.stop()

    async def run(self) -> None:
        await follow("watching the ResourceClaims", self._listwatch, self._take, lost=self._lost,
                     failing=(KubeError,),
                     doing="claim lifetimes polled meanwhile; listing again")

    def _lost(self) -> None:
        self.synced = False
        self.wake()

    def _take(self, item: Item) -> None:
        self.seen(item)
        if isinstance(item, Listed):
            self.synced = True
        if concerns(item, self.held()):
            self.woken += 1
            self.wake()
