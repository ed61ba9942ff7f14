"""The allocator's claim writes, and realising a partition through them.

## Claim transitions

The allocator's claim transitions, each one compare-and-set through `ClaimsStore.update`, whose
outbox announces it on the audit stream (partkeeper/claims/outbox.py: the same `ClaimChanged`,
same msg id, so the writer publishes nothing itself). Nothing else in the allocator writes
claims.

    (none) -> creating     begin       before the driver is asked for anything (invariant 4)
    creating -> active     activate    the instance exists; its identity is recorded
    creating -> removed    abandon     this Allocate undoes its own never-activated claim
    releasing -> removed   abandon     the same, when the Pod was declared gone meanwhile
    (releasing)            leave       the undo's destroy failed: the instance is recorded and
                                       the reclaimer finishes the job
    active -> releasing    release     DRA mode: the ResourceClaim's use on this node ended
    (active)               unprepared  DRA mode: NodeUnprepareResources came, or a new prepare
                                       cleared it (the claim's lifetime, docs/contract.md 11)

## Realising a partition: claim -> create (or adopt) -> activate, undo on failure

`realise` turns written partition claims into hardware, after the claims are durable as
`creating` (invariant 4). Both modes use it (device-plugin Allocate, DRA prepare). The only
destroys the allocator ever makes are here, in `undo`, of an instance this allocation created and
never activated (invariant 2's exception); anything it cannot undo is handed to the reclaimer
(`leave`).
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Mapping

import msgspec

from partkeeper import faults
from partkeeper.claims import StoreReadError, TransitionError, inventory, machine
from partkeeper.claims.store import Mutation
from partkeeper.drivers import DriverError, Instance, InstanceSpec, NotFoundError, PlacementError
from partkeeper.telemetry import tracing
from partkeeper.telemetry.logs import decision
from schemas import CardClaims, Claim, LiveInstance
from schemas.documents import ClaimKind
from services.allocator.core import state
from services.allocator.core.placement import Target
from services.allocator.core.refusal import Refusal, Result
from services.allocator.core.state import Context

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)


class Released(Exception):
    """The claim was found `releasing` at activation: its Pod was declared gone meanwhile."""


class Vanished(Exception):
    """The claim is no longer in the store."""


class WriteUnknown(Exception):
    """A claim write failed and a re-read could not say whether the store applied it."""


class Revisions:
    """The claims one allocation read, then what each of its writes wrote, by card: its next write
    on that card goes against that revision instead of reading the card again (a round trip per
    write). The compare-and-set keeps it safe: a revision another writer has passed is refused by
    the server and the store reads afresh. Held by the allocation and handed to each write it
    makes (`known=`); a write without one reads the card first."""

    def __init__(self, docs: Mapping[int, CardClaims], revisions: Mapping[int, int]) -> None:
        self._last = {card: (doc, revisions[card]) for card, doc in docs.items()}

    def take(self, card: int) -> tuple[CardClaims, int] | None:
        return self._last.pop(card, None)

    def wrote(self, card: int, result: tuple[CardClaims, int]) -> None:
        self._last[card] = result


async def _update(ctx: Context, card: int, mutate: Mutation, known: Revisions | None, *,
                  reason: str = "", claim_id: str = "") -> tuple[CardClaims, int]:
    """`ctx.store.update`, against the allocation's last read or write of the card when it has
    one. `reason`: why `claim_id`'s transition is made, for its audit entry."""
    last = known.take(card) if known is not None else None
    reasons = {claim_id: reason} if reason else None
    result = await ctx.store.update(card, mutate, reasons=reasons, known=last)
    if known is not None:
        known.wrote(card, result)
    return result


def new_claim(
    target: Target, *, kind: ClaimKind, resource: str, token: str, card: int, profile: str,
    start: int, size: int, now: float, claim_id: str | None = None, resource_claim: str = "",
    resource_claim_uid: str = "",
) -> Claim:
    """A `creating` claim, the one shape both modes write (`claim_id`: DRA mode keys its claims
    by ResourceClaim UID and device; device-plugin mode draws one)."""
    return Claim(
        id=claim_id or secrets.token_hex(8), kind=kind, state="creating", pod_uid=target.uid,
        namespace=target.namespace, name=target.name, container=target.container,
        resource=resource, device_ids=[token], card=card, profile=profile, start=start,
        size=size, created_at=now, updated_at=now, resource_claim=resource_claim,
        resource_claim_uid=resource_claim_uid,
    )


async def begin(ctx: Context, claim: Claim, known: Revisions | None = None) -> bool:
    """Write `claim` as creating; False when its placement is no longer free in the store."""
    mutate = functools.partial(machine.begin, claim=claim)

    async def write_once() -> None:
        # Every failed attempt is checked before the next: a write whose reply was lost may have
        # been applied, and writing it again would plan this claim a second placement.
        try:
            await _update(ctx, claim.card, mutate, known)
        except TransitionError:
            raise
        except Exception as exc:
            if not await _landed(ctx, claim, exc):
                raise
            decision(log, f"the reply to the claim write was lost ({exc!r}); the store holds it",
                     pod_uid=claim.pod_uid, card=claim.card, claim_id=claim.id)

    try:
        with _tracer.start_as_current_span("claim", attributes=span_attributes(claim)):
            await state.waiting(ctx, f"writing claim {claim.id}", write_once)
    except TransitionError as exc:
        decision(log, f"placement lost to another writer: {exc}", pod_uid=claim.pod_uid,
                 card=claim.card, claim_id=claim.id)
        return False
    decision(log, f"claimed {claim.profile} at {claim.start}+{claim.size} for {claim.container}",
             pod_uid=claim.pod_uid, card=claim.card, claim_id=claim.id, state="creating")
    return True


async def _landed(ctx: Context, claim: Claim, failure: Exception) -> bool:
    """After a write whose outcome is unknown (its reply timed out, the connection dropped):
    did the store apply it? Raises WriteUnknown when the re-read fails too."""
    try:
        doc, _ = await ctx.store.read(claim.card)
    except Exception as exc:
        raise WriteUnknown(f"writing claim {claim.id} on card {claim.card} failed ({failure!r}) "
                           f"and reading the card back failed too ({exc!r})") from failure
    return claim.id in doc.claims


def _activation(doc: CardClaims, claim_id: str, live: LiveInstance | None) -> CardClaims:
    current = doc.claims.get(claim_id)
    if current is None:
        raise Vanished(f"claim {claim_id} is no longer on card {doc.card}")
    if current.state == "releasing":
        raise Released(current.release_reason or "released")
    if current.state == "active":
        return doc  # a retry raced us to it; nothing to write
    now = time.time()
    if live is None:
        return machine.activate_slice(doc, claim_id, now)
    return machine.activate(doc, claim_id, live, now)


async def activate(
    ctx: Context, claim: Claim, instance: Instance | None, known: Revisions | None = None
) -> Claim:
    """creating -> active. Raises Released or Vanished (nothing written then)."""
    live = None
    if instance is not None:
        live = LiveInstance(gi_id=instance.gi_id, ci_id=instance.ci_id, uuid=instance.uuid)
    with _tracer.start_as_current_span("activate", attributes=span_attributes(claim)) as span:
        if live is not None:
            span.set_attribute("pk.instance_uuid", live.uuid)
        mutate = functools.partial(_activation, claim_id=claim.id, live=live)
        doc, _ = await state.waiting(ctx, f"activating claim {claim.id}",
                                        lambda: _update(ctx, claim.card, mutate, known))
        active = doc.claims[claim.id]
        decision(log, f"activated {claim.profile} at {claim.start}+{claim.size}",
                 pod_uid=claim.pod_uid, card=claim.card, claim_id=claim.id, state="active",
                 instance=live.uuid if live else None)
    return active


def _abandonment(doc: CardClaims, claim_id: str, found: list[bool]) -> CardClaims:
    found[:] = [claim_id in doc.claims]
    if not found[0]:
        return doc
    return machine.remove(doc, claim_id, abandon=True)


async def abandon(
    ctx: Context, claim: Claim, reason: str, known: Revisions | None = None
) -> None:
    """Remove a claim this Allocate wrote and never activated (no instance of it exists now).

    If the store cannot be written, the claim stays: it still only reserves room, its tokens go
    Unhealthy once kubelet fails the Pod, and the reclaimer removes it then.
    """
    found: list[bool] = []
    try:
        await _update(ctx, claim.card, functools.partial(_abandonment, claim_id=claim.id,
                                                         found=found),
                      known, reason=reason, claim_id=claim.id)
    except Exception as exc:
        decision(log, f"could not abandon the claim ({exc}); it is left to the reclaimer",
                 pod_uid=claim.pod_uid, card=claim.card, claim_id=claim.id)
        return
    if not found or not found[0]:
        return  # never written (or already gone): nothing to say
    decision(log, f"abandoned claim: {reason}", pod_uid=claim.pod_uid, card=claim.card,
             claim_id=claim.id, state="removed")


def _leaving(doc: CardClaims, claim_id: str, live: LiveInstance) -> CardClaims:
    current = doc.claims.get(claim_id)
    if current is None or current.state != "releasing" or current.instance is not None:
        return doc
    return machine.record_instance(doc, claim_id, live, time.time())


async def leave(
    ctx: Context, claim: Claim, instance: Instance, reason: str, known: Revisions | None = None
) -> None:
    """Our undo could not destroy the instance: leave it to the reclaimer, who alone destroys
    outside an Allocate. A claim already `releasing` gets the identity recorded so it can act at
    once; a `creating` one stays as it is, for kubelet's retry to adopt or, once its Pod is
    declared finished or gone, for the reclaimer to destroy at its spec."""
    live = LiveInstance(gi_id=instance.gi_id, ci_id=instance.ci_id, uuid=instance.uuid)
    await _update(ctx, claim.card, functools.partial(_leaving, claim_id=claim.id, live=live),
                  known)
    decision(log, f"left instance to the reclaimer: {reason}", pod_uid=claim.pod_uid,
             card=claim.card, claim_id=claim.id, instance=instance.uuid)


def _released(doc: CardClaims, claim_id: str, reason: str) -> CardClaims:
    current = doc.claims.get(claim_id)
    if current is None or current.state == "releasing":
        return doc
    return machine.release(doc, claim_id, reason, time.time())


async def release(ctx: Context, claim: Claim, reason: str) -> None:
    """Mark the claim releasing (the reclaimer destroys it); nothing when it is gone already or
    releasing. Raises TransitionError for a state that cannot be released."""
    doc, _ = await _update(
        ctx, claim.card, functools.partial(_released, claim_id=claim.id, reason=reason), None)
    now = doc.claims.get(claim.id)
    if now is None or now.release_reason != reason:
        return
    decision(log, f"released: {reason}", pod_uid=claim.pod_uid, card=claim.card,
             claim_id=claim.id, state="releasing")


def _unprepared(doc: CardClaims, claim_id: str, at: float) -> CardClaims:
    current = doc.claims.get(claim_id)
    if current is None or current.state == "releasing" or current.unprepared_at == at:
        return doc
    changed = msgspec.structs.replace(current, unprepared_at=at, updated_at=time.time())
    return msgspec.structs.replace(doc, claims={**doc.claims, claim_id: changed})


async def unprepared(
    ctx: Context, claim: Claim, at: float, known: Revisions | None = None
) -> None:
    """Record when kubelet unprepared the claim's ResourceClaim (0: prepared again)."""
    await _update(ctx, claim.card, functools.partial(_unprepared, claim_id=claim.id, at=at),
                  known)
    what = "unprepared" if at else "prepared again"
    decision(log, f"ResourceClaim {claim.resource_claim} {what} on this node",
             pod_uid=claim.pod_uid, card=claim.card, claim_id=claim.id)


def span_attributes(claim: Claim) -> dict[str, str | int]:
    """What every span about one claim says, so a Pod's or a claim's spans are found by tag."""
    return {"pk.pod_uid": claim.pod_uid, "pk.card": claim.card, "pk.claim_id": claim.id,
            "pk.profile": claim.profile, "pk.start": claim.start}




class Displaced(Exception):
    """The driver found the planned placement taken (an instance appeared since the plan, e.g.
    carved by hand); everything was undone and the caller may plan again."""


async def _at_spec(ctx: Context, claim: Claim) -> Instance | None:
    """The instance exactly at the claim's spec that no claim records, read afresh. Raises
    StoreReadError or DriverError when the claims or the card cannot be read."""
    doc, _ = await ctx.store.read(claim.card)
    instances = await ctx.hardware(ctx.driver.instances, claim.card)
    return inventory.classify(doc, instances, ctx.driver.same_partition).unrecorded.get(claim.id)


async def adopt(ctx: Context, claim: Claim) -> Instance | None:
    """An instance exactly at the claim's spec that no claim records: what a crash between create
    and activate leaves behind. A GPU instance without compute instance (the crash came inside
    the create) is not adopted: it has no UUID to hand out, and the retried create completes it.
    Raises Refusal when the card cannot be enumerated."""
    try:
        found = await _at_spec(ctx, claim)
    except Exception as exc:
        raise Refusal(Result.UNAVAILABLE, f"cannot finish claim {claim.id} of {_who(claim)}: "
                      f"reading card {claim.card} failed ({exc}); kubelet may retry") from exc
    return found if found is not None and found.complete else None


async def failed_create(
    ctx: Context, claim: Claim, reason: str, known: Revisions | None = None
) -> str:
    """After the driver failed to create `claim`'s partition: abandon the claim only if the card
    shows nothing at its spec. A create can fail halfway and its driver's undo fail too, leaving a
    GPU instance without compute instance; abandoning the claim over it would turn it foreign, a
    slot lost for good. Then the claim stays `creating` over it, for kubelet's retry to complete
    it or, once the Pod has ended, the reclaimer to destroy it at the spec. Unreadable counts as
    left. Returns what happened, as the end of the refusal's sentence."""
    try:
        left = await _at_spec(ctx, claim)
    except (StoreReadError, DriverError) as exc:
        decision(log, f"cannot tell what the failed create left ({exc}); the claim stays for the "
                 "reclaimer", pod_uid=claim.pod_uid, card=claim.card, claim_id=claim.id)
        return ("whether it left anything could not be read, so its claim stays for the "
                "reclaimer")
    if left is None:
        await abandon(ctx, claim, reason, known)
        return "nothing is left behind"
    await leave(ctx, claim, left, reason, known)
    return (f"it left GPU instance {left.gi_id} ({left.profile} at {left.start}), which its claim "
            "keeps for kubelet's retry to complete or the reclaimer to destroy")


async def create(ctx: Context, claim: Claim) -> Instance:
    spec = InstanceSpec(claim.card, claim.profile, claim.start)
    with _tracer.start_as_current_span("create", attributes=span_attributes(claim)) as span:
        try:
            instance = await ctx.change_hardware(ctx.driver.create, spec)
        except DriverError as exc:
            span.set_attribute("pk.driver_error", exc.kind)
            raise
        span.set_attribute("pk.instance_uuid", instance.uuid)
        return instance


async def realise(
    ctx: Context, claims: list[Claim], *, resume: bool = False,
    known: Revisions | None = None,
) -> list[Claim]:
    """Create (or, resuming, adopt) and activate every claim; all or nothing.

    On a driver failure or a claim found released, every instance this call created and did not
    activate is destroyed and its claim abandoned, and a Refusal says why.
    """
    made: list[tuple[Claim, Instance]] = []
    for claim in claims:
        try:
            found = await adopt(ctx, claim) if resume else None
            made.append((claim, found or await create(ctx, claim)))
        except PlacementError as exc:
            await undo(ctx, made, claims[len(made):], f"placement taken meanwhile: {exc}", known)
            raise Displaced(str(exc)) from exc
        except DriverError as exc:
            reason = f"create failed: {exc}"
            await undo(ctx, made, claims[len(made) + 1:], reason, known)
            behind = await failed_create(ctx, claim, reason, known)
            raise Refusal(Result.DRIVER, f"creating {claim.profile} at {claim.start} on card "
                          f"{claim.card} for {_who(claim)} failed: {exc}; {behind}, and kubelet "
                          "may retry") from exc
        await faults.reach("allocator.after_create")
    active: list[Claim] = []
    for i, (claim, instance) in enumerate(made):
        try:
            active.append(await activate(ctx, claim, instance, known))
        except (Released, Vanished) as exc:
            await undo(ctx, made[i:], [], f"its Pod was declared gone during the create ({exc})",
                       known)
            raise Refusal(Result.GONE, f"{_who(claim)} was declared gone while its partition was "
                          "being created; the new partition was destroyed again") from exc
    return active


async def undo(
    ctx: Context, made: list[tuple[Claim, Instance]], unmade: list[Claim], reason: str,
    known: Revisions | None = None,
) -> None:
    """Destroy what this Allocate created and never activated; abandon those claims."""
    for claim, instance in made:
        try:
            await ctx.change_hardware(ctx.driver.destroy, instance)
        except NotFoundError:
            pass
        except DriverError as exc:
            await leave(ctx, claim, instance, f"{reason}; undo failed: {exc}", known)
            continue
        await abandon(ctx, claim, reason, known)
    for claim in unmade:
        await abandon(ctx, claim, reason, known)


def _who(claim: Claim) -> str:
    return f"Pod {claim.namespace}/{claim.name} ({claim.pod_uid}) container {claim.container}"
