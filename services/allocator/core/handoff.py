"""Handing active partitions (and the cards of slices) to the container: the driver's container
edits and, with the CDI strategy, specs.

Every driver says what its vendor's container needs (`driver.container_edits` for partitions,
`driver.card_edits` for the whole cards logical slices sit on: env, device nodes, mounts;
docs/drivers.md, Container edits): the nvml driver the device specs NVIDIA's device plugin
passes, the T-Head and Hygon drivers their vendors' nodes and mounts, the sim driver only the env.
With `PK_DEVICE_LIST_STRATEGY=cdi` each partition also gets a CDI spec in `PK_CDI_DIR`
(partkeeper/cdi.py) carrying its own container edits, named by its claim id, returned in
`cdi_devices`. Runs after the claims are active and the descriptors written; a retried Allocate
writes the same bytes again.

Logical slices (`slice_handoff`): the cards' edits, the limits and the slice limiter's env and
mounts (partkeeper/limiter.py); with the CDI strategy one spec per container, named by its first
claim id, carrying the same edits (the reclaimer removes it with that claim).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from partkeeper import cdi
from partkeeper.drivers.base import ContainerEdits, DriverError, Instance
from schemas import Claim
from services.allocator.core import sliced
from services.allocator.core.refusal import Refusal, Result
from services.allocator.core.state import Context


def _refusal(claims: Sequence[Claim], what: str, done: str, exc: DriverError) -> Refusal:
    """The driver could not say what the container needs; the claims stay active, so kubelet's
    retry gets the same partitions (or slices) and asks again."""
    first = claims[0]
    return Refusal(Result.UNAVAILABLE, f"the {what} of claim(s) {','.join(c.id for c in claims)} "
                   f"of Pod {first.namespace}/{first.name} ({first.pod_uid}) are {done} but "
                   f"{exc}; kubelet may retry")


async def _edits(ctx: Context, claims: Sequence[Claim],
                 first: Callable[[], None] | None = None) -> ContainerEdits:
    """The driver's container edits for `claims`, after `first` (blocking work of the caller's
    that shares the thread hop); a refusal is a sentence."""
    instances = instances_of(claims)

    def edits() -> ContainerEdits:
        if first is not None:
            first()
        return ctx.driver.container_edits(instances)

    try:
        return await ctx.hardware(edits)
    except DriverError as exc:
        raise _refusal(claims, "partition(s)", "made", exc) from exc


async def card_edits(ctx: Context, claims: Sequence[Claim]) -> ContainerEdits:
    """The driver's edits for the whole cards slice `claims` sit on (by card index, each once);
    a refusal is a sentence."""
    cards = [ctx.card(index) for index in sorted({c.card for c in claims})]
    try:
        return await ctx.hardware(ctx.driver.card_edits, cards)
    except DriverError as exc:
        raise _refusal(claims, "slice(s)", "set up", exc) from exc


async def partition_handoff(ctx: Context, claims: Sequence[Claim], *,
                  first: Callable[[], None] | None = None) -> tuple[ContainerEdits, list[str]]:
    """The container edits of `claims` and the qualified CDI names written for them. `first`:
    blocking work run in the same thread hop just before the edits (what it raises, the call
    raises)."""
    edits = await _edits(ctx, claims, first)
    names: list[str] = []
    if ctx.config.device_list_strategy != "cdi":
        return edits, names
    for claim in claims:
        if claim.instance is None:
            continue
        own = edits if len(claims) == 1 else await _edits(ctx, [claim])
        env = {"PK_CLAIM_IDS": claim.id, "PK_POD_UID": claim.pod_uid}
        spec = cdi.spec_for(claim.id, claim.instance.uuid, own, env)
        try:
            await asyncio.to_thread(cdi.write_spec, ctx.config.cdi_dir, claim.id, spec)
        except cdi.CdiError as exc:
            raise Refusal(Result.UNAVAILABLE, f"partition {claim.instance.uuid} (claim "
                          f"{claim.id}, active) is made but {exc}; kubelet may retry") from exc
        names.append(cdi.qualified(claim.id))
    return edits, names


async def slice_handoff(ctx: Context, claims: list[Claim]) -> tuple[ContainerEdits, list[str]]:
    """Everything a container of active slice `claims` (in token order) gets, and the qualified
    CDI name of their spec where that strategy is on; logs the allocation's line saying whether
    the slices are enforced."""
    config = sliced.config_for(claims, {c.index: c for c in ctx.cards},
                               ctx.config.slices_per_card, ctx.limiter)
    edits = sliced.slice_edits(claims, config, ctx.config.pods_dir,
                               await card_edits(ctx, claims), sliced.limiter_edits(ctx, claims))
    names: list[str] = []
    if ctx.config.device_list_strategy == "cdi":
        first = claims[0]
        spec = cdi.spec_for(first.id, "", edits, {})
        spec["annotations"] = {f"{cdi.VENDOR}/card-uuids": ",".join(config.card_uuids),
                               f"{cdi.VENDOR}/slice-limiter": config.limiter}
        try:
            await asyncio.to_thread(cdi.write_spec, ctx.config.cdi_dir, first.id, spec)
        except cdi.CdiError as exc:
            raise Refusal(Result.UNAVAILABLE, f"the slice(s) of claim(s) "
                          f"{','.join(c.id for c in claims)} are set up but {exc}; kubelet may "
                          "retry") from exc
        names.append(cdi.qualified(first.id))
    sliced.log_handed_out(ctx, claims, config)
    return edits, names


def instances_of(claims: Sequence[Claim]) -> list[Instance]:
    """The live partitions of active claims, as the driver reported them."""
    found = []
    for c in claims:
        if c.instance is None:
            raise ValueError("every claim must be active with an instance before replying")
        live = c.instance
        found.append(Instance(c.card, c.profile, c.start, c.size, live.gi_id, live.ci_id,
                              live.uuid))
    return found
