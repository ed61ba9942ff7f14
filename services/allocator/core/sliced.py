"""Logical slices of cards not in partition mode: claims of kind "slice", limiter files, nothing
created on the hardware (the driver is asked only how a container reaches the whole cards, in the
reply: handoff.card_edits).

A sliced card offers `PK_SLICES_PER_CARD` slices; a slice claim sits in the card's claims document
like a partition claim (start = slice index, size = 1, profile "sliced"). Its effect is a limiter
configuration (memory MiB, compute percent) and a cache directory under
`PK_PODS_DIR/<podUID>/c-<container>/sliced/`, written with `partkeeper.workdir.write_sliced`
(which also writes the GC's ownership mark). Only the GC removes that tree.

Who enforces the limits is `PK_SLICE_LIMITER` (partkeeper/limiter.py): with `hami-core` the reply
also carries HAMi-core's env and mounts, its cache file inside `sliced/cache/`; with `none` the
slices are handed out all the same, and said to be unenforced (limits.json, the log line, the
capacity document `status` reads).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from partkeeper import limiter
from partkeeper.drivers import Card
from partkeeper.drivers.base import ContainerEdits, HostMount
from partkeeper.telemetry.logs import decision
from partkeeper.workdir import WorkdirError, sliced_dir, write_sliced
from schemas import Claim
from schemas.documents import SliceLimiterView
from services.allocator.core import writes
from services.allocator.core.refusal import Refusal, Result
from services.allocator.core.state import Context

log = logging.getLogger(__name__)

LIMITS_FILE = "limits.json"
CACHE_DIR = "cache"
CONTAINER_SLICED_DIR = "/var/run/partkeeper/sliced"


@dataclass(frozen=True, slots=True)
class SliceLimits:
    memory_mib: int
    compute_percent: int


class SliceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What the limiter inside the container reads (limits.json)."""

    pod_uid: str
    container: str
    card_uuids: list[str]
    slices: list[int]
    memory_mib: int
    compute_percent: int
    cache_dir: str
    limiter: str = limiter.NONE  # who enforces these limits; "none": nothing does
    enforced: bool = False


def limits(card: Card, slices_per_card: int, count: int = 1) -> SliceLimits:
    """`count` slices' share of one card's memory and compute."""
    return SliceLimits(
        memory_mib=card.memory_mib * count // slices_per_card,
        compute_percent=max(1, 100 * count // slices_per_card),
    )


def per_card(
    claims: list[Claim], cards: dict[int, Card], slices_per_card: int
) -> list[SliceLimits]:
    """Each card's share, in card index order (the order the container sees the cards in)."""
    counts: dict[int, int] = {}
    for claim in claims:
        counts[claim.card] = counts.get(claim.card, 0) + 1
    return [limits(cards[i], slices_per_card, n) for i, n in sorted(counts.items())]


def config_for(
    claims: list[Claim], cards: dict[int, Card], slices_per_card: int,
    state: limiter.LimiterState | None = None,
) -> SliceConfig:
    first = claims[0]
    per_card = [limits(cards[c.card], slices_per_card) for c in claims]
    return SliceConfig(
        pod_uid=first.pod_uid,
        container=first.container,
        card_uuids=sorted({cards[c.card].uuid for c in claims}),
        slices=[c.card * slices_per_card + c.start for c in claims],
        memory_mib=sum(lim.memory_mib for lim in per_card),
        compute_percent=min(100, sum(lim.compute_percent for lim in per_card)),
        cache_dir=CACHE_DIR,
        limiter=state.name if state else limiter.NONE,
        enforced=state.enforced if state else False,
    )


def limiter_edits(ctx: Context, claims: list[Claim]) -> ContainerEdits:
    """The limiter's env and mounts for these slices (none without a limiter). HAMi-core applies
    one SM limit to every device, so a container on several cards gets the smallest share."""
    if ctx.limiter.name != limiter.HAMI_CORE:
        return ContainerEdits()
    shares = per_card(claims, {c.index: c for c in ctx.cards}, ctx.config.slices_per_card)
    return limiter.hami_edits(
        [s.memory_mib for s in shares], min(s.compute_percent for s in shares),
        Path(ctx.limiter.dir), f"{CONTAINER_SLICED_DIR}/{CACHE_DIR}",
        str(ctx.options.limiter_lock_dir),
    )


def limiter_view(ctx: Context) -> SliceLimiterView:
    """The limiter as the capacity document reports it (`partkeeper status`)."""
    found = ctx.limiter
    return SliceLimiterView(name=found.name, enforced=found.enforced, dir=found.dir,
                            missing=list(found.missing))


def log_handed_out(ctx: Context, claims: list[Claim], config: SliceConfig) -> None:
    """The Allocate's one line: which slices went where, and whether anything enforces them."""
    first = claims[0]
    how = (f"enforced by {ctx.limiter.name}" if ctx.limiter.enforced
           else "UNENFORCED (no slice limiter: the container can use the whole card)")
    decision(log, f"slice(s) {','.join(map(str, config.slices))} for {first.namespace}/"
             f"{first.name} container {first.container}: {config.memory_mib} MiB, "
             f"{config.compute_percent}% compute, {how}", pod_uid=first.pod_uid, card=first.card,
             claim_id=",".join(c.id for c in claims), slice_limiter=ctx.limiter.name,
             slices_enforced=ctx.limiter.enforced)


async def write_files(ctx: Context, claims: list[Claim]) -> Path:
    cards = {c.index: c for c in ctx.cards}
    body = msgspec.json.encode(config_for(claims, cards, ctx.config.slices_per_card, ctx.limiter))
    first = claims[0]
    return await asyncio.to_thread(
        write_sliced, ctx.config.pods_dir, first.pod_uid, first.container,
        {LIMITS_FILE: body}, CACHE_DIR,
    )


async def realise(
    ctx: Context, claims: list[Claim], known: writes.Revisions | None = None
) -> list[Claim]:
    """Write the slice files, then activate the claims; abandon them if the files fail."""
    try:
        await write_files(ctx, claims)
    except WorkdirError as exc:
        for claim in claims:
            await writes.abandon(ctx, claim, f"writing the slice files failed: {exc}", known)
        first = claims[0]
        raise Refusal(Result.UNAVAILABLE, f"cannot write the slice files of Pod {first.namespace}/"
                      f"{first.name} ({first.pod_uid}) container {first.container}: {exc}") from exc
    active: list[Claim] = []
    for claim in claims:
        try:
            active.append(await writes.activate(ctx, claim, None, known))
        except (writes.Released, writes.Vanished) as exc:
            for rest in claims[len(active):]:
                await writes.abandon(ctx, rest, f"its Pod was declared gone ({exc})", known)
            raise Refusal(Result.GONE, f"Pod {claim.namespace}/{claim.name} ({claim.pod_uid}) "
                          "was declared gone while its slice was being set up") from exc
    return active


def slice_edits(
    claims: Sequence[Claim], config: SliceConfig, pods_dir: Path, edits: ContainerEdits,
    limiter: ContainerEdits,
) -> ContainerEdits:
    """Everything a slice container gets, as one set of edits (the reply and the CDI spec carry
    the same). `edits`: the driver's for the whole cards the slices sit on (`driver.card_edits`);
    `limiter`: the slice limiter's (empty without one)."""
    first = claims[0]
    host = sliced_dir(pods_dir, first.pod_uid, first.container)
    env = {
        **edits.env,
        **limiter.env,
        "PK_RESOURCE": first.resource,
        "PK_SLICE_INDEXES": ",".join(str(i) for i in config.slices),
        "PK_SLICE_MEMORY_MIB": str(config.memory_mib),
        "PK_SLICE_COMPUTE_PERCENT": str(config.compute_percent),
        "PK_SLICE_CONFIG": f"{CONTAINER_SLICED_DIR}/{LIMITS_FILE}",
        "PK_SLICE_CACHE_DIR": f"{CONTAINER_SLICED_DIR}/{CACHE_DIR}",
        "PK_SLICE_LIMITER": config.limiter,
        "PK_SLICE_ENFORCED": "true" if config.enforced else "false",
        "PK_CLAIM_IDS": ",".join(c.id for c in claims),
        "PK_POD_UID": first.pod_uid,
    }
    mounts = (
        *edits.mounts,
        HostMount(f"{CONTAINER_SLICED_DIR}/{LIMITS_FILE}", str(host / LIMITS_FILE),
                  read_only=True),
        HostMount(f"{CONTAINER_SLICED_DIR}/{CACHE_DIR}", str(host / CACHE_DIR), read_only=False),
        *limiter.mounts,
    )
    return ContainerEdits(env=env, devices=edits.devices, mounts=mounts)
