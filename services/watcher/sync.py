"""Keeping the view in step with the API server: LIST, then WATCH from the LIST's version.

- A watch that ends normally (its `timeout_seconds`) is resumed from the last version seen,
  events' and bookmarks' alike.
- 410 Gone means the history to resume from is lost: LIST again. The LIST compares every known
  Pod with the current state, so what happened in the lost history is still observed: changed
  Pods are Seen, deleted ones are absent from a newer LIST.
- An unreachable API server is retried with capped, jittered backoff, for ever; while it is
  unreachable nothing is observed, so nothing is declared gone.
- When NATS cannot take an effect, the loop LISTs again after a backoff: the persisted view is
  the checkpoint, and a LIST re-derives whatever was not persisted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from partkeeper.bus import backoff
from partkeeper.telemetry import logs
from services.watcher import observe
from services.watcher.kube import Expired, Kube, KubeError, MalformedStream, as_kube_error
from services.watcher.observe import Listing, Readings
from services.watcher.pods import Resources, object_rv
from services.watcher.stream import Ended, WatchRequest
from services.watcher.tuning import Tuning
from services.watcher.view import PodView, ViewError

log = logging.getLogger(__name__)


class Sync:
    def __init__(self, kube: Kube, view: PodView, resources: Resources, tuning: Tuning) -> None:
        self.kube = kube
        self.view = view
        self.resources = resources
        self.tuning = tuning
        self.failures = 0  # consecutive failed attempts, for the backoff
        # The version the next watch resumes from; None: LIST first.
        self.resume_from: str | None = None
        self._watch: WatchRequest | None = None

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """LIST and WATCH until cancelled; `ready` is set after the first LIST is applied."""
        while True:
            try:
                if self.resume_from is None:
                    self.resume_from = await self.relist()
                    if ready is not None:
                        ready.set()
                if await self._watch_once(self.resume_from):
                    self.failures = 0
                else:
                    await self._back_off(f"the watch from resourceVersion {self.resume_from} "
                                         "ended at once")
            except Expired as exc:
                self.resume_from = None
                await self._back_off(f"{exc}; listing again (the LIST observes what the lost "
                                     "history held)")
            except MalformedStream as exc:
                await self._back_off(f"skipped the rest of a watch: {exc}; it changes nothing, "
                                     f"resuming from resourceVersion {self.resume_from}")
            except KubeError as exc:
                await self._back_off(
                    f"API server unreachable or failing ({exc}); no Pod is declared gone meanwhile"
                )
            except ViewError as exc:
                self.resume_from = None
                await self._back_off(f"{exc}; will LIST again")

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    async def _back_off(self, why: str) -> None:
        self.failures += 1
        wait = backoff.delay(self.failures, base=self.tuning.retry_base, cap=self.tuning.retry_cap)
        log.warning("%s; retry %d in %.1fs", why, self.failures, wait,
                    extra={"retry": self.failures})
        await asyncio.sleep(wait)

    async def relist(self) -> str:
        """LIST the node's Pods and apply what it shows; returns its resourceVersion.

        Raises KubeError when the API server cannot answer (nothing is applied then) and
        ViewError when NATS cannot take an effect.
        """
        listing = await self.kube.list_pods()
        await self.apply_listing(listing)
        return listing.resource_version

    async def apply_listing(self, listing: Listing) -> None:
        readings = observe.from_list(
            self.view.records(), listing, node=self.kube.node, resources=self.resources
        )
        if readings.absence_withheld:
            log.warning("no Pod is declared absent from the LIST at resourceVersion %s: %s",
                        listing.resource_version, readings.absence_withheld)
        await self._apply(readings)
        self.view.caught_up(listing.resource_version)
        logs.decision(log, "listed the node's Pods", resource_version=listing.resource_version,
                      pods=len(listing.items), skipped=len(readings.skipped))

    async def _apply(self, readings: Readings) -> None:
        for skipped in readings.skipped:
            log.warning("skipped %s; it changes nothing", skipped, extra={"pod_uid": skipped.uid})
        for observation in readings.observations:
            await self.view.apply(observation)

    async def _watch_once(self, rv: str) -> bool:
        """One watch request from `rv`, moving `resume_from` along; returns whether it was
        healthy (it delivered something, or lasted most of its timeout)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        watch = WatchRequest(self.kube, rv, timeout_seconds=self.tuning.watch_timeout_seconds,
                             read_slack=self.tuning.request_timeout[1])
        self._watch = watch.start()
        delivered = False
        try:
            while True:
                item = await watch.queue.get()
                if isinstance(item, Ended):
                    if item.error is not None:
                        raise as_kube_error(item.error, f"watch from resourceVersion {rv}")
                    return delivered or loop.time() - started >= watch.timeout_seconds / 2
                delivered = True
                if self.failures:
                    log.info("watching again from resourceVersion %s", rv)
                    self.failures = 0
                await self._handle(item)
        finally:
            watch.stop()
            self._watch = None

    async def _handle(self, item: dict[str, Any] | None) -> None:
        """Apply one watch item and move the resume point to its version."""
        if item is None:
            log.warning("skipped a watch line that is not JSON; it changes nothing")
            return
        if item.get("type") != "BOOKMARK":
            await self._apply(
                observe.from_watch(item, node=self.kube.node, resources=self.resources)
            )
        reached = object_rv(item.get("object"))
        if reached is not None:
            self.resume_from = str(reached)
            self.view.caught_up(self.resume_from)
