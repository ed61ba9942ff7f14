"""Following a list-watch of the API server until cancelled: the one loop of the DRA watches.

Each LIST and watch event goes to `take`. An expired watch (410) lists again at once, as the
client-go reflector does; a failed one (the API server unreachable, a watch that ends at once)
lists again after the schedule's wait. `lost` is told both, so a watcher that lets others wait
on its events (ClaimWatch) knows it no longer may.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, NoReturn

from urllib3.exceptions import HTTPError

from partkeeper import backoff
from partkeeper.listwatch import EndedAtOnce, Event, Expired, Listed, ListWatch, WatchFailed
from services.allocator.dra.kube import KubeError

log = logging.getLogger(__name__)

Item = Listed[list[dict[str, Any]]] | Event


async def follow(
    what: str,
    listwatch: ListWatch[list[dict[str, Any]]],
    take: Callable[[Item], None],
    *,
    lost: Callable[[], None] = lambda: None,
    doing: str = "listing again",
) -> NoReturn:
    failures = backoff.Failures(what, backoff.Schedule(cap=10.0))
    while True:
        try:
            async with contextlib.aclosing(listwatch.items()) as items:
                async for item in items:
                    take(item)
                    failures.succeeded()
        except Expired:
            lost()
            log.info("%s: the watch expired; listing again", what)
        except (EndedAtOnce, WatchFailed, KubeError, HTTPError, OSError) as exc:
            lost()
            listwatch.resume_from = None
            await asyncio.sleep(failures.failed(exc, doing))
