"""Re-making a partition a host reboot removed, for the Pod whose container kubelet starts again
(docs/operations.md, "After a reboot"; both modes).

After a reboot the claims stay in the node's store, marked `rebooted` by the first service to
start (partkeeper/claims/boot.py), and hold no room. kubelet then starts the Pods' containers
again: in device-plugin mode it calls `Allocate` with the device IDs its checkpoint holds for the
container, in DRA mode `NodePrepareResources` for the same ResourceClaim. Either finds the
rebooted claim carrying what it names, and the claim is re-made here:

    plan (`spot`, pure)  ->  write it `creating` at the spot (`machine.remake`, a CAS; before the
    driver is asked: invariant 4)  ->  the caller realises it as any creating claim

The old partition's descriptor is removed with the re-make (it describes nothing any more; the
re-made partition's is written at the reply, as for any). The claim keeps its id, its Pod and
container and its device IDs, so the IDs kubelet holds stay
valid and a retried call finds the same claim (invariant 7). Where: its old placement when free,
else the lowest free legal placement of its profile on the same card (a claim is one card's
document: it does not move); DRA mode passes only the allocated device's placement, which the
scheduler fixed in the ResourceClaim.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping, Sequence

import msgspec

from partkeeper.claims import TransitionError, machine
from partkeeper.drivers import Instance
from partkeeper.telemetry.logs import decision
from partkeeper.workdir import WorkdirError, remove_descriptor
from schemas import Claim
from services.allocator.core import state
from services.allocator.core.catalog import Range
from services.allocator.core.placement import Snapshot, Spot, free_ranges, occupied
from services.allocator.core.refusal import Refusal, Result
from services.allocator.core.state import Context, SnapshotError

log = logging.getLogger(__name__)


def spot(
    claim: Claim, legal: Sequence[Range], claims: Sequence[Claim],
    instances: Sequence[Instance], failed: frozenset[int],
) -> Spot | None:
    """Where the rebooted `claim` is re-made: its old placement if nothing covers it now, else
    the lowest free one of `legal` on its card; None when the card has failed or is full."""
    if claim.card in failed:
        return None
    others = [c for c in claims if c.id != claim.id]
    taken = occupied(others, instances, claim.kind).get(claim.card, [])
    free = free_ranges(legal, taken)
    old = (claim.start, claim.size)
    if old in free:
        return Spot(claim.card, *old)
    return Spot(claim.card, *free[0]) if free else None


def plan(
    group: Sequence[Claim], legal: Mapping[int, Sequence[Range]], snap: Snapshot
) -> list[tuple[Claim, Spot]] | str:
    """A spot for each rebooted claim of `group`, each planned beside the ones before it; or the
    sentence saying which one has no room. Those whose old placement is free go first, so one
    that has to move never takes another's old placement. In the group's order."""
    chosen: list[tuple[Claim, Spot]] = []
    claims = list(snap.claims)
    stays = {c.id for c in group
             if spot(c, legal.get(c.card, ()), claims, snap.all_instances, snap.failed)
             == Spot(c.card, c.start, c.size)}
    for claim in sorted(group, key=lambda c: c.id not in stays):
        found = spot(claim, legal.get(claim.card, ()), claims, snap.all_instances, snap.failed)
        if found is None:
            why = "has failed" if claim.card in snap.failed else "has no free placement of it"
            return (f"the host rebooted and claim {claim.id} of Pod {claim.namespace}/"
                    f"{claim.name} ({claim.pod_uid}) is to be re-made as {claim.profile}, but card "
                    f"{claim.card} {why}")
        chosen.append((claim, found))
        claims = [c for c in claims if c.id != claim.id] + [_placed(claim, found)]
    order = {c.id: i for i, c in enumerate(group)}
    return sorted(chosen, key=lambda pair: order[pair[0].id])


def _placed(claim: Claim, at: Spot) -> Claim:
    return msgspec.structs.replace(claim, start=at.start, size=at.size, rebooted=False)


async def remake(
    ctx: Context, group: Sequence[Claim], legal: Mapping[int, Sequence[Range]], until: float
) -> list[Claim]:
    """Write each rebooted claim of `group` `creating` at its planned spot and return the group
    with them so (the others unchanged), for the caller's realisation. Raises Refusal when the
    claims or cards cannot be read or a claim has no room: nothing was written then for it."""
    rebooted = [c for c in group if c.rebooted]
    if not rebooted:
        return list(group)
    async with ctx.placing:  # one plan at a time, as a new allocation's
        try:
            snap = await state.waiting(ctx, "reading the claims", lambda: state.read(ctx), until)
        except SnapshotError as exc:
            raise Refusal(Result.UNAVAILABLE, f"{exc}; nothing was re-made") from exc
        current = {c.id: c for c in snap.claims}
        if gone := [c for c in group if c.id not in current]:
            first = gone[0]
            raise Refusal(Result.GONE, f"claim {first.id} of Pod {first.namespace}/{first.name} "
                          f"({first.pod_uid}) was removed meanwhile (its Pod ended); nothing was "
                          "re-made")
        fresh = [current[c.id] for c in rebooted]
        planned = plan([c for c in fresh if c.rebooted], legal, snap)
        if isinstance(planned, str):
            raise Refusal(Result.FULL, f"{planned}; nothing was re-made, and kubelet may retry")
        made: dict[str, Claim] = {}
        for claim, at in planned:
            made[claim.id] = await _write(ctx, claim, at)
    return [made.get(c.id) or current[c.id] for c in group]


async def _write(ctx: Context, claim: Claim, at: Spot) -> Claim:
    now = time.time()
    mutate = functools.partial(machine.remake, claim_id=claim.id, start=at.start, size=at.size,
                               now=now)
    try:
        doc, _ = await state.waiting(
            ctx, f"re-making claim {claim.id}",
            lambda: ctx.store.update(claim.card, mutate, reasons={
                claim.id: "re-made after a host reboot"}))
    except TransitionError as exc:
        raise Refusal(Result.UNAVAILABLE, f"re-making claim {claim.id} after the reboot: {exc}; "
                      "nothing was re-made, and kubelet may retry") from exc
    again = doc.claims[claim.id]
    if claim.instance is not None:
        await _forget_descriptor(ctx, claim, claim.instance.uuid)
    decision(log, f"re-making {claim.profile} at {at.start}+{at.size} after a host reboot "
             f"(was at {claim.start}+{claim.size})", pod_uid=claim.pod_uid, card=claim.card,
             claim_id=claim.id, state="creating")
    return again


async def _forget_descriptor(ctx: Context, claim: Claim, uuid: str) -> None:
    """The old partition's descriptor describes nothing now (the reboot removed it): gone before
    the re-made one's is written, so a partition re-made under another UUID leaves no stale file
    keeping the Pod's directory (the GC removes only empty ones). Nothing else is touched."""
    try:
        await asyncio.to_thread(remove_descriptor, ctx.config.pods_dir, claim.pod_uid,
                                claim.container, uuid)
    except (WorkdirError, OSError) as exc:
        log.warning("the descriptor of the partition %s the reboot removed could not be removed "
                    "(%s); the re-made partition gets its own", uuid, exc,
                    extra={"pod_uid": claim.pod_uid, "card": claim.card, "claim_id": claim.id})
