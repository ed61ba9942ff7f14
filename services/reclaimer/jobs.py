"""One job per claim being resolved, each retrying on its own schedule.

A job is the in-process driver of one claim towards removal; the durable record of the intent is
the claim itself (`releasing`), so a job lost in a crash is recreated by the next event delivery
or reconcile pass. Jobs are keyed by (card, claim id): the event path, `reclaim.now` and the
reconcile pass asking for the same claim share one job. A job whose card refuses sleeps between
attempts without holding anything, so other claims, on that card or others, proceed. Each job
keeps the trace context its steps' spans continue (services/reclaimer/spans.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from opentelemetry import context as otel_context

from partkeeper.lifecycle import cancel_all, woken_or_timeout
from services.reclaimer import spans
from services.reclaimer.context import Context
from services.reclaimer.pods import Evidence
from services.reclaimer.resolve import Again, Later, Outcome, attempt
from services.reclaimer.tuning import retry_delay

log = logging.getLogger(__name__)
Key = tuple[int, str]
TICK_SECONDS = 10.0  # well inside the consumer's 30 s ack wait


class Job:
    def __init__(
        self, card: int, claim_id: str, evidence: Evidence, parent: otel_context.Context
    ) -> None:
        self.card = card
        self.claim_id = claim_id
        self.evidence = evidence
        self.parent = parent  # the trace its steps' spans belong to
        self.outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.stalled = False  # waiting to retry after a failed or blocked step
        self.last = "not started"
        self.failures = 0
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def resolved(self) -> bool:
        return self.outcome.done() and not self.outcome.cancelled() and self.outcome.result().done

    @property
    def idle(self) -> bool:
        """Nothing more happens to it without a wake-up: resolved, failed or stalled."""
        return self.outcome.done() or self.stalled


class Jobs:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.running: dict[Key, Job] = {}
        self._changed = asyncio.Event()  # replaced on every change: a wake-up, no data

    def ensure(self, card: int, claim_id: str, evidence: Evidence, *, urgent: bool = False) -> Job:
        """The claim's job, started if needed. Stronger evidence (a death) replaces weaker."""
        job = self.running.get((card, claim_id))
        here = otel_context.get_current()
        if job is None:
            job = Job(card, claim_id, evidence, here)
            self.running[(card, claim_id)] = job
            job.task = asyncio.create_task(self._run(job), name=f"reclaim-{card}-{claim_id}")
            return job
        if not spans.traced(job.parent) and spans.traced(here):
            job.parent = here  # started by the (untraced) reconcile pass: join the caller's trace
        if evidence.dead and not job.evidence.dead:
            job.evidence = evidence
            urgent = True
        if urgent:
            job.stalled = False  # it is about to try again; waiters should see that attempt
            job.wake.set()
        return job

    async def wait_idle(
        self, jobs: list[Job], patience: float, *, tick: Callable[[], Awaitable[None]] | None = None
    ) -> bool:
        """Wait until every job is resolved or stalled, at most `patience` seconds.

        True when all are resolved. `tick` is called every TICK_SECONDS while waiting (to keep
        a message alive).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        next_tick = loop.time() + TICK_SECONDS
        while not all(j.idle for j in jobs):
            left = deadline - loop.time()
            if left <= 0:
                break
            await woken_or_timeout(self._changed, min(left, TICK_SECONDS))
            if tick is not None and loop.time() >= next_tick:
                await tick()
                next_tick = loop.time() + TICK_SECONDS
        return all(j.resolved for j in jobs)

    async def close(self) -> None:
        await cancel_all([j.task for j in self.running.values() if j.task is not None])

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _run(self, job: Job) -> None:
        try:
            outcome = await self._drive(job)
            job.outcome.set_result(outcome)
        except asyncio.CancelledError:
            job.outcome.set_result(Outcome(job.card, job.claim_id, False, "reclaimer stopping"))
            raise
        finally:
            self.running.pop((job.card, job.claim_id), None)
            self._notify()

    async def _drive(self, job: Job) -> Outcome:
        while True:
            token = otel_context.attach(job.parent)
            try:
                result = await attempt(self.ctx, job.card, job.claim_id, job.evidence, job.failures)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not end the job: the claim would be stranded
                log.exception("resolving claim %s on card %d failed", job.claim_id, job.card)
                result = Later(retry_delay(job.failures + 1, self.ctx.tuning), repr(exc))
            finally:
                otel_context.detach(token)
            if isinstance(result, Outcome):
                job.last = result.reason
                return result
            if isinstance(result, Again):
                job.failures = 0
                continue
            job.failures += 1
            job.stalled = True
            job.last = result.why
            self._notify()
            await woken_or_timeout(job.wake, result.delay)
            job.wake.clear()
            job.stalled = False
