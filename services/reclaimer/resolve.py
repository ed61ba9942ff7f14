"""One step towards resolving one claim: read, enumerate, decide, act. The only destroy path.

The Pod-event consumer, `reclaim.now` and the reconcile pass all resolve claims through here, so
whichever comes first does the work and the others find it done. Each step re-reads the claim and
re-enumerates the card (in that order: an instance recorded in the claim existed before the claim
was read, so its absence from a later enumeration is real), and every write is a compare-and-set
that re-checks the claim it decided on. One exception: a destroy the driver confirmed (or a card
whose partition mode is off) is followed by the removal at once, without enumerating again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from partkeeper import backoff, faults
from partkeeper.claims import StoreReadError, TransitionError, machine
from partkeeper.claims.store import ConflictExhausted
from partkeeper.drivers.base import (
    DriverError,
    IdentityMismatchError,
    Instance,
    ModeOffError,
    NotFoundError,
)
from partkeeper.telemetry import metrics
from partkeeper.telemetry.logs import decision
from schemas import CardClaims, Claim
from services.reclaimer.context import Context, Enumeration
from services.reclaimer.decide import Decision, Step, decide, needs_sighting, sighting
from services.reclaimer.pods import Evidence
from services.reclaimer.spans import failed, step
from services.reclaimer.tuning import retry_delay
from services.reclaimer.workdir import drop_cdi_spec, drop_descriptor

log = logging.getLogger(__name__)
_REMOVED = "instance destroyed or confirmed absent"


@dataclass(frozen=True, slots=True)
class Outcome:
    card: int
    claim_id: str
    done: bool  # the claim is gone from the store (its instance destroyed or absent)
    reason: str


@dataclass(frozen=True, slots=True)
class Again:
    """The step was taken; decide the next one now."""


@dataclass(frozen=True, slots=True)
class Later:
    delay: float
    why: str


Result = Outcome | Again | Later
Known = tuple[CardClaims, int]  # a card's document and the revision it was read at


async def attempt(
    ctx: Context, card: int, claim_id: str, evidence: Evidence, failures: int
) -> Result:
    """Take the next step for the claim; `failures` counts this job's failed steps so far."""
    await ctx.audit.flush()
    try:
        doc, revision = await ctx.store.read(card)
    except StoreReadError as exc:
        log.warning("claims of card %d unreadable: %s; retrying", card, exc)
        return Later(retry_delay(failures + 1, ctx.tuning), f"claims unreadable: {exc}")
    claim = doc.claims.get(claim_id)
    if claim is None:
        return Outcome(card, claim_id, True, "the claim is no longer in the store")
    found = await ctx.enumerate(card) if needs_sighting(claim, evidence.pod) else Enumeration(None)
    seen = sighting(doc, claim_id, found.instances, ctx.driver.same_partition, lost=found.lost)
    chosen = decide(claim, seen, evidence.pod, time.time(),
                    create_timeout=ctx.tuning.create_timeout,
                    lost_bound=ctx.tuning.destroy_threshold)
    try:
        # The step's write goes against this read (no second read; a revision another writer
        # has passed is refused, and the store reads afresh).
        return await _take(ctx, claim, chosen, evidence, failures, (doc, revision))
    except (StoreReadError, ConflictExhausted) as exc:
        _log(claim, "claims store refused the step", str(exc), level=logging.WARNING)
        return Later(retry_delay(failures + 1, ctx.tuning), f"claims store: {exc}")


async def _take(
    ctx: Context, claim: Claim, chosen: Decision, evidence: Evidence, failures: int,
    known: Known,
) -> Result:
    match chosen.step:
        case Step.KEEP:
            return Outcome(claim.card, claim.id, False, chosen.why)
        case Step.REFUSE:
            _log(claim, "claim left alone", chosen.why, level=logging.ERROR)
            return Later(retry_delay(ctx.tuning.destroy_threshold, ctx.tuning), chosen.why)
        case Step.WAIT:
            delay = retry_delay(failures + 1, ctx.tuning)
            if chosen.wait > 0:
                delay = min(chosen.wait, backoff.delay(failures + 1, cap=2.0))
            return Later(delay, chosen.why)
        case Step.RELEASE:
            reason = evidence.reason if evidence.dead else chosen.why
            return await _release(ctx, claim, reason, known)
        case Step.DESTROY:
            assert chosen.instance is not None
            return await _destroy(ctx, claim, chosen.instance, evidence)
        case Step.REMOVE:
            return await _remove(ctx, claim, known=known)
        case Step.LOST:
            uuid = claim.instance.uuid if claim.instance is not None else None
            return await _count_failure(ctx, claim, uuid, "card_lost", chosen.why)
        case Step.ABANDON:
            return await _abandon(ctx, claim, chosen.why, known)
    raise AssertionError(f"unhandled step {chosen.step}")


async def _release(ctx: Context, claim: Claim, reason: str, known: Known) -> Result:
    now = time.time()
    released = False

    def mutate(doc: CardClaims) -> CardClaims:
        nonlocal released
        current = doc.claims.get(claim.id)
        released = current is not None and current.state in ("creating", "active")
        return machine.release(doc, claim.id, reason, now) if released else doc

    with step("release", claim) as span:
        span.set_attribute("pk.reason", reason)
        doc, _ = await ctx.store.update(claim.card, mutate, known=known)
        span.set_attribute("pk.released", released)
        if released:
            marked = doc.claims[claim.id]
            _log(marked, "claim releasing", reason)  # the store's outbox announces it
            await faults.reach("reclaimer.after_releasing")
    return Again()


async def _destroy(ctx: Context, claim: Claim, instance: Instance, evidence: Evidence) -> Result:
    with step("destroy", claim, instance) as span:
        try:
            await ctx.destroy(instance)
        except ModeOffError as exc:
            # No instance can exist with the card's mode off: done, and the removal says why.
            span.set_attribute("pk.absent", True)
            _log(claim, "instance gone with the card's partition mode", str(exc),
                 level=logging.WARNING)
            return await _remove(ctx, claim, f"instance gone: {exc}")
        except NotFoundError:
            span.set_attribute("pk.absent", True)
            _log(claim, "instance already absent", instance.uuid)
            return Again()
        except IdentityMismatchError as exc:
            # Someone else's instance holds that GPU-instance id now; re-enumerate before acting.
            failed(span, exc.kind, str(exc))
            _log(claim, "identity changed; re-checking", str(exc), level=logging.WARNING)
            return Later(backoff.delay(1), f"identity changed: {exc}")
        except DriverError as exc:
            failed(span, exc.kind, str(exc))
            return await _destroy_failed(ctx, claim, instance, exc)
    if evidence.observed_at is not None:
        metrics.RECLAIM_SECONDS.observe(max(0.0, time.time() - evidence.observed_at))
    _log(claim, "instance destroyed", instance.uuid)
    await faults.reach("reclaimer.after_destroy")
    # The driver has just confirmed it gone, as after a mode-off above: the removal follows at
    # once, on a fresh read of the claim, without enumerating the card again to see it absent
    # (a driver call on the way to re-advertising the room). What the card shows
    # still decides the advertisement: the allocator enumerates before it offers a slot.
    return await _remove(ctx, claim)


async def _destroy_failed(
    ctx: Context, claim: Claim, instance: Instance, exc: DriverError
) -> Result:
    return await _count_failure(ctx, claim, instance.uuid, exc.kind, str(exc))


async def _count_failure(
    ctx: Context, claim: Claim, instance_uuid: str | None, kind: str, said: str
) -> Result:
    """A destroy that failed, or could not be tried because the card is lost: counted in the
    claim (the bound survives restarts), reported once the threshold is reached."""
    metrics.DESTROY_FAILURES.labels(reason=kind).inc()
    attempts = claim.release_attempts + 1
    now = time.time()
    try:
        await ctx.store.update(claim.card, lambda d: machine.count_attempt(d, claim.id, now))
    except (TransitionError, StoreReadError, ConflictExhausted) as err:
        log.warning("could not count the failed destroy of claim %s: %s", claim.id, err)
    if attempts == ctx.tuning.destroy_threshold and instance_uuid is not None:
        # Kubernetes Events are the watcher's to write; it turns DestroyFailed into one.
        await ctx.audit.destroy_failed(claim, instance_uuid, kind, said, attempts)
    delay = retry_delay(attempts, ctx.tuning)
    why = f"destroy failed ({kind}, attempt {attempts}): {said}; retrying in {delay:.1f}s"
    _log(claim, "destroy failed", why, level=logging.WARNING)
    return Later(delay, why)


async def _abandon(ctx: Context, claim: Claim, why: str, known: Known) -> Result:
    """The card stayed lost for the whole bound: the claim goes, with that reason, so that it
    neither blocks the card's room nor is retried for ever. Only a releasing claim gets here:
    its Pod is gone or finished, or its ResourceClaim ended."""
    metrics.DESTROY_FAILURES.labels(reason="card_lost").inc()
    if claim.instance is not None:
        # The Event names the partition the Pod had; the watcher writes it.
        await ctx.audit.destroy_failed(claim, claim.instance.uuid, "card_lost", why,
                                       claim.release_attempts + 1)
    _log(claim, "claim abandoned", why, level=logging.WARNING)
    return await _remove(ctx, claim, f"abandoned: {why}", known=known)


async def _remove(ctx: Context, claim: Claim, reason: str = _REMOVED,
                  known: Known | None = None) -> Result:
    # The removal's ClaimChanged is published inside this span: the allocator's capacity update
    # continues the trace from it.
    with step("remove", claim) as span:
        result = await _removal(ctx, claim, reason, known)
        span.set_attribute("pk.removed", isinstance(result, Outcome))
    return result


async def _removal(ctx: Context, claim: Claim, reason: str, known: Known | None) -> Result:
    if claim.kind == "partition" and claim.instance is not None:
        # Before the claim goes: while the claim exists, a crash here is finished on restart.
        await drop_descriptor(ctx.config.pods_dir, claim, claim.instance.uuid)
    # Slices too: with the CDI strategy a slice container's spec is named by its first claim.
    await drop_cdi_spec(ctx.config.cdi_dir, claim)
    removed = False

    def mutate(doc: CardClaims) -> CardClaims:
        nonlocal removed
        current = doc.claims.get(claim.id)
        removed = False
        if current is None:
            return doc
        if current.state != "releasing" or current.instance != claim.instance:
            # The allocator recorded an instance since we looked: decide again on it.
            return doc
        removed = True
        return machine.remove(doc, claim.id)

    doc, _ = await ctx.store.update(claim.card, mutate, reasons={claim.id: reason},
                                    known=known)
    if claim.id in doc.claims:
        return Again()
    if removed:
        _log(claim, "claim removed", reason)  # the store's outbox announces it
    return Outcome(claim.card, claim.id, True, "destroyed and removed")


def _log(claim: Claim, message: str, detail: str, *, level: int = logging.INFO) -> None:
    fields = {"pod_uid": claim.pod_uid, "card": claim.card, "claim_id": claim.id}
    if level == logging.INFO:
        decision(log, message, detail=detail, **fields)
    else:
        log.log(level, "%s: %s", message, detail, extra=fields)
