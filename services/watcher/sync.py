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
import contextlib
import logging

from partkeeper import backoff
from partkeeper.listwatch import EndedAtOnce, Event, Expired, Listed, ListWatch, WatchFailed
from partkeeper.telemetry import logs
from services.watcher import observe
from services.watcher.kube import Expired as KubeExpired
from services.watcher.kube import Kube, KubeError, MalformedStream, as_kube_error
from services.watcher.observe import Listing, Readings
from services.watcher.pods import Resources, object_rv
from services.watcher.tuning import Tuning
from services.watcher.view import PodView, ViewError

log = logging.getLogger(__name__)


class Sync:
    def __init__(self, kube: Kube, view: PodView, resources: Resources, tuning: Tuning) -> None:
        self.kube = kube
        self.view = view
        self.resources = resources
        self.tuning = tuning
        # Consecutive failed attempts, for the backoff; a watch item that arrives resets them.
        self.failures = backoff.Failures("keeping the Pod view in step with the API server",
                                         backoff.Schedule(tuning.retry_base, tuning.retry_cap))
        self.listwatch: ListWatch[Listing] = ListWatch(
            self._list, kube.watch_call, timeout_seconds=tuning.watch_timeout_seconds,
            request_timeout=(kube.request_timeout[0], tuning.request_timeout[1]),
            threads=kube.watch_threads,
        )

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """LIST and WATCH until cancelled; `ready` is set after the first LIST is applied."""
        while True:
            try:
                async with contextlib.aclosing(self.listwatch.items()) as items:
                    async for item in items:
                        if isinstance(item, Listed):
                            await self.apply_listing(item.value)
                            if ready is not None:
                                ready.set()
                        else:
                            await self._handle(item)
            except (Expired, KubeExpired) as exc:  # the watch's or a LIST's 410
                self.listwatch.resume_from = None
                await self._back_off(f"{exc}; listing again (the LIST observes what the lost "
                                     "history held)")
            except EndedAtOnce as exc:
                await self._back_off(str(exc))
            except WatchFailed as exc:
                doing = f"watch from resourceVersion {self.listwatch.resume_from}"
                await self._watch_failed(as_kube_error(exc.error, doing))
            except KubeError as exc:
                await self._unreachable(exc)
            except ViewError as exc:
                self.listwatch.resume_from = None
                await self._back_off(f"{exc}; will LIST again")

    async def _watch_failed(self, exc: KubeError) -> None:
        if isinstance(exc, MalformedStream):
            await self._back_off(f"skipped the rest of a watch: {exc}; it changes nothing, "
                                 f"resuming from resourceVersion {self.listwatch.resume_from}")
        else:
            await self._unreachable(exc)

    async def _unreachable(self, exc: KubeError) -> None:
        await self._back_off(
            f"API server unreachable or failing ({exc}); no Pod is declared gone meanwhile"
        )

    def stop(self) -> None:
        self.listwatch.stop()

    async def _back_off(self, why: str) -> None:
        await asyncio.sleep(self.failures.failed(why))

    async def relist(self) -> str:
        """LIST the node's Pods and apply what it shows; returns its resourceVersion.

        Raises KubeError when the API server cannot answer (nothing is applied then) and
        ViewError when NATS cannot take an effect.
        """
        listing = await self.kube.list_pods()
        await self.apply_listing(listing)
        return listing.resource_version

    async def _list(self) -> tuple[str, Listing]:
        listing = await self.kube.list_pods()
        return listing.resource_version, listing

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

    async def _handle(self, event: Event) -> None:
        """Apply one watch item; the view has caught up with its version."""
        if self.failures.count:
            log.info("watching again from resourceVersion %s", self.listwatch.resume_from)
            self.failures.succeeded()
        item = event.raw
        if item is None:
            log.warning("skipped a watch line that is not JSON; it changes nothing")
            return
        if item.get("type") != "BOOKMARK":
            await self._apply(
                observe.from_watch(item, node=self.kube.node, resources=self.resources)
            )
        reached = object_rv(item.get("object"))
        if reached is not None:
            self.view.caught_up(str(reached))
