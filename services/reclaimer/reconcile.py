"""The reconcile pass: claims against physical instances against the watcher's Pod view.

Run at start and every PK_RESYNC_SECONDS. It reads the hardware, then the claims, then the
hardware again, and acts only on what all three agree on:
- an instance is foreign only if it is in both enumerations and no claim read between them
  describes it (a claim removed mid-read, with its instance destroyed, is not mistaken for one);
- a claim's instance has vanished only if it is missing from the enumeration made after the
  claim was read (an instance recorded in a claim existed before the claim was written).
A failed enumeration or store read skips the whole pass: nothing is ever inferred from it.
Claims needing work are handed to the jobs, the one path that releases and destroys.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from partkeeper import backoff
from partkeeper.claims import StoreReadError, inventory, machine
from partkeeper.drivers.base import CardLostError, DriverError, Instance, NotFoundError
from partkeeper.telemetry import metrics
from partkeeper.telemetry.logs import decision
from schemas import CardClaims
from services.reclaimer import foreign, leftovers
from services.reclaimer.context import Context
from services.reclaimer.decide import Step, decide, sighting
from services.reclaimer.jobs import Jobs
from services.reclaimer.pods import Evidence, ask

log = logging.getLogger(__name__)
Listing = dict[int, list[Instance]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    before: Listing  # partition cards' instances, read before the claims
    docs: dict[int, CardClaims]
    after: Listing  # read after the claims
    lost: frozenset[int] = frozenset()  # cards that stopped answering: in neither listing


class Reconciler:
    def __init__(self, ctx: Context, jobs: Jobs) -> None:
        self.ctx = ctx
        self.jobs = jobs
        self.known: dict[foreign.Key, foreign.Sighted] = {}
        self.passes = 0
        self.skipped = 0
        self._wake = asyncio.Event()

    def trigger(self) -> None:
        """Ask for a pass soon; triggers arriving during a pass coalesce into one more."""
        self._wake.set()

    async def run(self) -> None:
        """A pass every `resync_seconds`, or sooner when woken; a failed pass is logged and the
        next one, a period later, starts from fresh reads."""
        period = self.ctx.config.resync_seconds
        await backoff.every("reconcile pass", period, self._pass, wakeup=self._wake,
                            schedule=lambda _failures: period)

    async def _pass(self) -> None:
        try:
            await self.pass_once()
        except Exception:
            self.skipped += 1
            raise

    async def pass_once(self) -> bool:
        """One pass; False when it was skipped because something could not be read."""
        await self.ctx.audit.flush(outbox=True)
        snap = await self._snapshot()
        if snap is None:
            self.skipped += 1
            return False
        verdicts = await self._verdicts(snap.docs)
        self._claims(snap, verdicts)
        await self._foreign(snap)
        await leftovers.sweep(self.ctx.driver)
        self.passes += 1
        return True

    async def _snapshot(self) -> Snapshot | None:
        driver = self.ctx.driver
        lost: set[int] = set()

        async def listed(card: int) -> list[Instance] | None:
            # A lost card fails every read; the others are still reconciled. Any other failed
            # read fails the pass (fail closed).
            try:
                return await asyncio.to_thread(driver.instances, card)
            except CardLostError as exc:
                log.warning("card %d is lost, its claims are resolved without it: %s", card, exc)
                lost.add(card)
                return None

        try:
            cards = await asyncio.to_thread(driver.cards)
            parts = [c.index for c in cards if c.mode == "partition"]
            before = {i: found for i in parts if (found := await listed(i)) is not None}
            docs = await self.ctx.documents([c.index for c in cards])
            after = {i: found for i in parts if (found := await listed(i)) is not None}
        except (DriverError, StoreReadError) as exc:
            log.warning("reconcile pass skipped, nothing changed: %s", exc)
            return None
        # A card lost between the two reads is in one only: treat it as lost in both.
        before = {i: v for i, v in before.items() if i not in lost}
        after = {i: v for i, v in after.items() if i not in lost}
        return Snapshot(before, docs, after, frozenset(lost))

    async def _verdicts(self, docs: dict[int, CardClaims]) -> dict[str, Evidence]:
        """The watcher's view of every Pod holding a claim not yet releasing."""
        uids = sorted({c.pod_uid for d in docs.values() for c in d.claims.values()
                       if c.state != "releasing" and not c.resource_claim_uid})
        verdicts: dict[str, Evidence] = {}
        for uid in uids:
            evidence = await ask(self.ctx.nc, self.ctx.node, uid, fresh=False,
                                 timeout=self.ctx.tuning.watcher_timeout)
            verdicts[uid] = evidence
            if evidence.pod == "no-answer":
                # One silent watcher makes the rest silent too; do not wait on each in turn.
                rest = Evidence("no-answer", evidence.reason)
                verdicts.update({u: rest for u in uids if u not in verdicts})
                break
        return verdicts

    def _claims(self, snap: Snapshot, verdicts: dict[str, Evidence]) -> None:
        now = time.time()
        for card, doc in snap.docs.items():
            for claim in doc.claims.values():
                evidence = verdicts.get(claim.pod_uid) or Evidence("no-answer", "reconcile")
                seen = sighting(doc, claim.id, snap.after.get(card), self.ctx.driver.same_partition,
                                lost=card in snap.lost)
                chosen = decide(claim, seen, evidence.pod, now,
                                create_timeout=self.ctx.tuning.create_timeout,
                                lost_bound=self.ctx.tuning.destroy_threshold)
                if chosen.step is Step.KEEP:
                    continue
                decision(log, "reconcile hands claim over", pod_uid=claim.pod_uid, card=card,
                         claim_id=claim.id, step=str(chosen.step), why=chosen.why)
                self.jobs.ensure(card, claim.id, evidence)

    async def _foreign(self, snap: Snapshot) -> None:
        current: list[Instance] = []
        for card, instances in snap.before.items():
            doc = snap.docs.get(card) or machine.empty(self.ctx.node, card)
            still = {foreign.key(i) for i in snap.after[card]}
            found = inventory.classify(doc, instances, self.ctx.driver.same_partition).foreign
            current.extend(i for i in found if foreign.key(i) in still)
        now = time.time()
        change = foreign.diff(self.known, current, now)
        self.known = change.known
        for seen in change.found:
            _log_instance("foreign instance found", seen.instance)
            await self.ctx.audit.foreign_found(seen.instance, seen.since)
        for seen in change.gone:
            _log_instance("foreign instance gone", seen.instance)
            await self.ctx.audit.foreign_gone(seen.instance, seen.since, reaped=False)
        metrics.FOREIGN_INSTANCES.set(len(self.known))
        config = self.ctx.config
        for seen in foreign.reapable(self.known, now, policy=config.foreign_policy,
                                     grace=config.foreign_grace_seconds):
            await self._reap(seen)

    async def _reap(self, seen: foreign.Sighted) -> None:
        inst = seen.instance
        try:
            busy = await asyncio.to_thread(self.ctx.driver.is_busy, inst)
        except DriverError as exc:
            log.warning("foreign %s on card %d: busy check failed (%s); kept", inst.uuid,
                        inst.card, exc)
            return
        if busy:
            return
        try:
            await self.ctx.destroy(inst)
        except NotFoundError:
            pass
        except DriverError as exc:
            metrics.DESTROY_FAILURES.labels(reason=exc.kind).inc()
            log.warning("reaping foreign %s failed: %s; next pass retries", inst.uuid, exc)
            return
        self.known.pop(foreign.key(inst), None)
        metrics.FOREIGN_INSTANCES.set(len(self.known))
        _log_instance("foreign instance reaped", inst)
        await self.ctx.audit.foreign_gone(inst, seen.since, reaped=True)


def _log_instance(message: str, inst: Instance) -> None:
    decision(log, message, card=inst.card, instance_uuid=inst.uuid, profile=inst.profile,
             start=inst.start, gi_id=inst.gi_id)
