"""Collecting one Pod's working directory: look, ask, decide, delete, announce.

The same path serves the event consumer and the periodic sweep. One collection per Pod UID runs at
a time, so an event and a sweep never race each other over the same directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext

from partkeeper import backoff, faults, workdir
from partkeeper.bus import publish
from partkeeper.config import Config
from partkeeper.telemetry import logs, metrics
from schemas import PodsGetReply, WorkdirCollected, validate_pod_uid
from schemas.names import gc_parts_subject
from services.gc import ask, decide
from services.gc.decide import UNANSWERED, Code, Plan, Verdict
from services.gc.report import Reporter

log = logging.getLogger(__name__)

PUBLISH_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class Outcome:
    uid: str
    verdict: Verdict
    code: Code
    reason: str
    removed: tuple[str, ...] = ()
    left: tuple[tuple[str, str], ...] = ()

    @property
    def unanswered(self) -> bool:
        """A question went unanswered: the sweep stops asking for now."""
        return self.code in UNANSWERED


class Collector:
    def __init__(
        self,
        config: Config,
        nc: Client,
        *,
        device_of: workdir.DeviceOf = workdir.st_device,
        reporter: Reporter | None = None,
    ) -> None:
        self.root = config.pods_dir
        self.node = config.node
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.device_of = device_of
        self.reporter = reporter or Reporter()
        self.asked = ask.Asked()
        self.scan_cache = workdir.ScanCache()
        self._busy: dict[str, asyncio.Event] = {}

    async def collect(
        self,
        uid: str,
        listing: workdir.PodListing | None = None,
        pod: PodsGetReply | None = None,
    ) -> Outcome:
        """Collect what is the GC's of Pod `uid`, if the watcher and the allocator allow it.

        `listing` is a recent scan of the directory (the sweep has one) used to decide whether to
        ask at all; the deletions are always planned on a fresh scan. `pod` is the watcher's
        answer when the sweep already asked (in a batch); otherwise pods.get is asked here.
        Raises InvalidPodUID for a malformed UID before any path is built from it.
        """
        uid = validate_pod_uid(uid)
        async with self._exclusive(uid):
            try:
                return await self._collect(uid, listing, pod)
            except workdir.WorkdirError as exc:
                logs.decision(log, "gc could not read or delete; will retry", pod_uid=uid,
                              error=str(exc))
                metrics.GC_REFUSED.labels("error").inc()
                return Outcome(uid, "defer", "unsafe", f"working directory error: {exc}")

    async def _scan(self, uid: str) -> workdir.PodListing:
        return await asyncio.to_thread(workdir.scan_pod, self.root, uid, device_of=self.device_of)

    def refused(self, listing: workdir.PodListing, work: Plan, pod: PodsGetReply) -> Outcome:
        """The sweep's verdict on a Pod the watcher did not confirm gone or finished: nothing is
        read, asked or deleted (decide.decide refuses before it looks at the claims). `work` is
        the listing's `decide.candidates`, whose report the sweep has made already."""
        plan = decide.decide(listing, pod, None, work)
        return self._not_collected(listing.uid, plan)

    async def _collect(
        self, uid: str, listing: workdir.PodListing | None, pod: PodsGetReply | None
    ) -> Outcome:
        listing = listing or await self._scan(uid)
        plan = decide.candidates(listing)
        if plan.verdict == "collect":
            if pod is None:
                pod = await ask.pod_state(self.nc, self.node, uid, self.asked)
            claims = None
            if decide.confirmed_done(pod):
                claims = await ask.pod_claims(self.nc, self.node, uid, self.asked)
            plan = decide.decide(listing, pod, claims)
            if plan.verdict == "collect":
                # The answers are final (gone and finished do not revert); the directory may
                # have changed while we asked, so plan the deletions on what is there now.
                plan = decide.decide(await self._scan(uid), pod, claims)
        self.reporter.unrecognised(uid, plan.report)
        if plan.verdict != "collect":
            return self._not_collected(uid, plan)
        removed, left = await self._execute(uid, plan)
        self.reporter.left(uid, left)
        if removed:
            await self._announce(uid, removed)
        logs.decision(log, "gc collected Pod working directory", pod_uid=uid,
                      reason=plan.reason, removed=removed, left=[p for p, _ in left])
        return Outcome(uid, "collect", plan.code, plan.reason, tuple(removed), tuple(left))

    def _not_collected(self, uid: str, plan: Plan) -> Outcome:
        if plan.verdict in ("defer", "refuse"):
            metrics.GC_REFUSED.labels(plan.code).inc()
            after = "will ask again later" if plan.verdict == "defer" else "left in place"
            message = f"gc deletes nothing: {plan.reason}; {after}"
            if plan.code in ("live", "unknown"):  # what every sweep hears: counted, not logged
                log.debug(message, extra={"pod_uid": uid, "code": plan.code})
            else:
                logs.decision(log, message, pod_uid=uid, verdict=plan.verdict, code=plan.code)
        return Outcome(uid, plan.verdict, plan.code, plan.reason)

    async def _execute(self, uid: str, plan: Plan) -> tuple[list[str], list[tuple[str, str]]]:
        removed: list[str] = []
        left: list[tuple[str, str]] = []
        for container in plan.sliced:
            await faults.reach("gc.before_delete")
            purge = await asyncio.to_thread(
                workdir.collect_sliced, self.root, uid, container, device_of=self.device_of
            )
            top = f"{uid}/{workdir.CONTAINER_PREFIX}{container}/{workdir.SLICED}"
            removed += [p for p in purge.removed if p == top]
            left += purge.left
        if plan.rmdirs or plan.pod_rmdir:
            await faults.reach("gc.before_delete")
            purge = await asyncio.to_thread(
                workdir.remove_empty, self.root, uid, plan.rmdirs,
                include_pod=plan.pod_rmdir, device_of=self.device_of,
            )
            removed += purge.removed
            left += purge.left
        return removed, left

    async def _announce(self, uid: str, removed: list[str]) -> None:
        event = WorkdirCollected(node=self.node, at=time.time(), pod_uid=uid, removed=removed)
        # The id names the fact (these paths of this Pod were removed), so a retry is de-duplicated.
        digest = hashlib.sha256("\n".join(sorted(removed)).encode()).hexdigest()[:16]
        msg_id = f"WorkdirCollected/{uid}/{digest}"
        try:
            await backoff.retry(
                f"publishing WorkdirCollected for Pod {uid}",
                lambda: publish(self.js, gc_parts_subject(self.node), event, msg_id=msg_id),
                attempts=PUBLISH_ATTEMPTS,
            )
        except Exception as exc:
            # The deletion already happened and cannot be redone to re-announce it.
            log.error("WorkdirCollected for Pod %s not published after %d attempts (%s); "
                      "the deletion stands, only its audit record is missing",
                      uid, PUBLISH_ATTEMPTS, exc)
            return
        metrics.GC_COLLECTED.inc()

    @contextlib.asynccontextmanager
    async def _exclusive(self, uid: str) -> AsyncIterator[None]:
        while (busy := self._busy.get(uid)) is not None:
            await busy.wait()
        done = asyncio.Event()
        self._busy[uid] = done
        try:
            yield
        finally:
            del self._busy[uid]
            done.set()

