"""Asking the watcher and kubelet about the Pods an Allocate may serve: the I/O behind the pure
decisions of `whichpod.py`.

The watcher may lag behind kubelet, so the lookup looks again, asking for a fresh LIST after the
first miss, and a watcher that gives no usable answer (during a JetStream election it cannot
persist what its fresh LIST saw) is asked again. Each question is one retry loop, bounded by the
Allocate's deadline (`until`, loop time, set once in `allocate.py`) and, while the watcher answers
but no candidate is seen, by the lookup policy's attempts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence, Set

from partkeeper import backoff
from partkeeper.bus import Unanswered
from partkeeper.bus.clients import WatcherClient
from partkeeper.lifecycle import cancel_all
from partkeeper.podstate import being_admitted, is_dead
from schemas import Claim, PodsGetReply
from services.allocator.core import patience
from services.allocator.core.context import Context
from services.allocator.core.refusal import Refusal, Result
from services.allocator.core.writes import Target
from services.allocator.deviceplugin import whichpod
from services.allocator.deviceplugin.whichpod import Holder

log = logging.getLogger(__name__)


class LookupFailed(Exception):
    """The Pod could not be found or its state not learned by the Allocate's deadline."""


async def find(
    ctx: Context, resource: str, quantity: int, claimed: Set[tuple[str, str]], until: float
) -> Target:
    """The container this Allocate serves. Raises LookupFailed naming what was seen.

    Looks again (the lookup policy's schedule) while no candidate is seen, for its attempts, or
    while the watcher gives no usable answer; while several remain after narrowing and fresh
    confirmation, waits up to `choose_wait_seconds` for them to narrow to one, then refuses
    rather than guesses. Never past `until`.
    """
    choose_until = min(until, asyncio.get_running_loop().time() +
                       ctx.options.choose_wait_seconds)
    policy = ctx.options.lookup
    looks = 0
    found: list[Target] = []

    async def look() -> Target | backoff.Again:
        nonlocal looks, found
        looks += 1
        answered, found, seen = await _look(ctx, resource, quantity, claimed, fresh=looks > 1,
                                            until=until)
        if (target := whichpod.chosen(found)) is not None:
            return target
        if not answered:
            return backoff.Again(seen, until=until)
        return backoff.Again(seen, until=choose_until if found else None)

    try:
        return await backoff.retry(
            f"finding the Pod an Allocate of {quantity} x {resource} serves", look,
            transient=backoff.never, schedule=policy.delay, attempts=policy.attempts,
            deadline=until, level=logging.INFO)
    except backoff.GaveUp as exc:
        seen, attempt = exc.problem, exc.attempts
    if len(found) > 1:
        names = " and ".join(f"{t.namespace}/{t.name}" for t in found)
        raise LookupFailed(
            f"an Allocate of {quantity} x {resource} on node {ctx.node} could serve Pod {names}, "
            "all pending and confirmed live, and kubelet's pod-resources API did not say which "
            "one it is admitting; refused rather than guessed, since a wrong guess hands one "
            "Pod's partition to another; kubelet may retry"
        )
    raise LookupFailed(
        f"no pending Pod on node {ctx.node} waits for {quantity} x {resource} "
        f"({seen}), after {attempt} attempts"
    )


async def _look(
    ctx: Context, resource: str, quantity: int, claimed: Set[tuple[str, str]], *, fresh: bool,
    until: float,
) -> tuple[bool, list[Target], str]:
    """One look: whether the watcher answered, the candidates that survive narrowing and
    confirmation, and what was seen. The watcher's list and kubelet's view are independent
    reads, made side by side."""
    viewing = asyncio.create_task(ctx.podres.view(), name="pod-resources view")
    try:
        reply = await _watcher(ctx).pending(resource, quantity, fresh=fresh)
    except Unanswered as exc:
        await cancel_all([viewing])
        # A refused request is a miss like any other; no answer is asked again until `until`.
        return not patience.unanswered(exc), [], f"the watcher's pods.pending failed: {exc}"
    except BaseException:
        await cancel_all([viewing])  # cancelled: the view must not outlive the lookup
        raise
    kubelet = await viewing
    found = whichpod.survivors(reply.pods, resource, quantity, claimed, kubelet)
    if len(found) > 1:
        found = await confirm(ctx, found, until)
    listed = ", ".join(f"{p.namespace}/{p.name}" for p in reply.pods) or "none"
    narrowed = "" if kubelet is None else " kubelet is admitting none of them;"
    return True, found, f"pending Pods listed: {listed};{narrowed} claimed ones excluded"


async def confirm(ctx: Context, found: Sequence[Target], until: float) -> list[Target]:
    """Those the watcher, asked afresh, still knows as being admitted (no answer: kept)."""

    async def still(target: Target) -> bool:
        try:
            answer = await pod_state(ctx, target.uid, until)
        except LookupFailed as exc:
            log.info("%s; %s stays a candidate", exc, target)
            return True
        return being_admitted(answer.pod)

    keep = await asyncio.gather(*(still(t) for t in found))
    return [t for t, kept in zip(found, keep, strict=True) if kept]


async def pod_state(ctx: Context, uid: str, until: float) -> PodsGetReply:
    """The watcher's answer about one Pod, confirmed with the API server, asked again while it
    gives no usable answer, until `until`."""
    try:
        return await patience.answered(until, f"pods.get {uid}",
                                       lambda: _watcher(ctx).pod(uid, fresh=True))
    except Unanswered as exc:
        raise LookupFailed(f"the watcher did not say whether Pod {uid} is live ({exc})") from None


async def judge(ctx: Context, group: list[Claim], until: float) -> Holder:
    """What the claims carrying an Allocate's device IDs mean (`whichpod.holder`), asked afresh
    of the watcher and kubelet."""
    first = group[0]
    if ctx.pods.dead(first.pod_uid):
        return Holder.DEAD
    try:
        answer = await pod_state(ctx, first.pod_uid, until)
    except LookupFailed as exc:
        raise Refusal(Result.UNAVAILABLE, f"device IDs {','.join(first.device_ids)} are held "
                      f"by claim {first.id} of Pod {first.namespace}/{first.name}; {exc}, so "
                      "a retry cannot be told from a re-use; nothing was claimed").about(
            first.pod_uid, first.namespace, first.name) from exc
    if is_dead(answer.state):
        return Holder.DEAD
    admitted = being_admitted(answer.pod)
    kubelet = await ctx.podres.view() if admitted else None
    return whichpod.holder(first, dead=False, being_admitted=admitted, kubelet=kubelet)


def _watcher(ctx: Context) -> WatcherClient:
    return WatcherClient(ctx.nc, ctx.node, ctx.options.lookup.timeout)
