"""Turning written partition claims into hardware: create (or adopt), activate, undo.

Runs after the claims are durable as `creating` (invariant 4). The only destroys the allocator
ever makes are here, in `undo`, of an instance this Allocate created and never activated
(invariant 2's exception); anything it cannot undo is handed to the reclaimer.
"""

from __future__ import annotations

import logging

from partkeeper import faults
from partkeeper.claims import StoreReadError, inventory
from partkeeper.drivers import DriverError, Instance, InstanceSpec, NotFoundError, PlacementError
from partkeeper.telemetry import tracing
from partkeeper.telemetry.logs import decision
from schemas import Claim
from services.allocator.core import writes
from services.allocator.core.context import Context
from services.allocator.core.refusal import Refusal, Result

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)


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
    ctx: Context, claim: Claim, reason: str, known: writes.Revisions | None = None
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
        await writes.abandon(ctx, claim, reason, known)
        return "nothing is left behind"
    await writes.leave(ctx, claim, left, reason, known)
    return (f"it left GPU instance {left.gi_id} ({left.profile} at {left.start}), which its claim "
            "keeps for kubelet's retry to complete or the reclaimer to destroy")


async def create(ctx: Context, claim: Claim) -> Instance:
    spec = InstanceSpec(claim.card, claim.profile, claim.start)
    with _tracer.start_as_current_span("create", attributes=writes.span_attributes(claim)) as span:
        try:
            instance = await ctx.change_hardware(ctx.driver.create, spec)
        except DriverError as exc:
            span.set_attribute("pk.driver_error", exc.kind)
            raise
        span.set_attribute("pk.instance_uuid", instance.uuid)
        return instance


async def realise(
    ctx: Context, claims: list[Claim], *, resume: bool = False,
    known: writes.Revisions | None = None,
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
            active.append(await writes.activate(ctx, claim, instance, known))
        except (writes.Released, writes.Vanished) as exc:
            await undo(ctx, made[i:], [], f"its Pod was declared gone during the create ({exc})",
                       known)
            raise Refusal(Result.GONE, f"{_who(claim)} was declared gone while its partition was "
                          "being created; the new partition was destroyed again") from exc
    return active


async def undo(
    ctx: Context, made: list[tuple[Claim, Instance]], unmade: list[Claim], reason: str,
    known: writes.Revisions | None = None,
) -> None:
    """Destroy what this Allocate created and never activated; abandon those claims."""
    for claim, instance in made:
        try:
            await ctx.change_hardware(ctx.driver.destroy, instance)
        except NotFoundError:
            pass
        except DriverError as exc:
            await writes.leave(ctx, claim, instance, f"{reason}; undo failed: {exc}", known)
            continue
        await writes.abandon(ctx, claim, reason, known)
    for claim in unmade:
        await writes.abandon(ctx, claim, reason, known)


def _who(claim: Claim) -> str:
    return f"Pod {claim.namespace}/{claim.name} ({claim.pod_uid}) container {claim.container}"
