"""The simulated kubelet's status manager: Pod status reaches the API server after a lag.

kubelet acts on a Pod's state at once (a stopped Pod's devices are free for the next admission,
a rejected Pod's never taken), while its status manager writes the status to the API server
asynchronously. `lag` models that delay, so anything that reads the API server (our watcher)
sees a stopped Pod as Running, or a rejected one as Pending, for that long. Writes of one Pod
reach the API server in the order they were made; the final delete of a Pod waits for its
last status write, as kubelet's status manager deletes only once the terminal status is out.
"""

from __future__ import annotations

import asyncio
import logging

from partkeeper.lifecycle import cancel_all
from partkeeper_sim.kubelet.records import PodRecord
from partkeeper_sim.kubelet.source import PodSource

log = logging.getLogger(__name__)


class StatusManager:
    def __init__(self, source: PodSource, lag: float = 0.0) -> None:
        self._source = source
        self.lag = lag
        self._writes: set[asyncio.Task[None]] = set()

    async def report(self, rec: PodRecord, phase: str, reason: str, message: str) -> None:
        """Queue the status write; at once (awaited) when there is no lag."""
        if self.lag <= 0 and (rec.status_write is None or rec.status_write.done()):
            await self._write(rec, phase, reason, message)
            return
        task = asyncio.create_task(self._lagged(rec.status_write, rec, phase, reason, message),
                                   name=f"sim-kubelet status {rec.pod.uid}")
        rec.status_write = task
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def written(self, rec: PodRecord) -> None:
        """Wait until every status write of the Pod so far has reached the API server."""
        if rec.status_write is not None:
            await asyncio.gather(asyncio.shield(rec.status_write), return_exceptions=True)

    async def stop(self) -> None:
        await cancel_all(list(self._writes))

    async def _lagged(self, before: asyncio.Task[None] | None, rec: PodRecord, phase: str,
                      reason: str, message: str) -> None:
        await asyncio.sleep(self.lag)
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        await self._write(rec, phase, reason, message)

    async def _write(self, rec: PodRecord, phase: str, reason: str, message: str) -> None:
        try:
            await self._source.set_phase(rec.pod.uid, phase, reason, message)
        except Exception as exc:
            # Status is advisory to the simulation; the Pod may be gone from the API already.
            log.warning("reporting %s for Pod %s (%s) failed: %r", phase, rec.pod.key,
                        rec.pod.uid, exc)
