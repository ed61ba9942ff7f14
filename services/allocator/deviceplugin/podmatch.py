"""Which Pod and container an Allocate serves (kubelet does not say).

The watcher lists the pending Pods of this node requesting the resource in that quantity, oldest
first by (creationTimestamp, namespace, name), as kubelet admits them. Containers that already
hold a claim are skipped; when kubelet's pod-resources API answers, only containers it lists
without devices of that resource remain (the one it is admitting right now). The watcher may lag
behind kubelet, so the lookup retries, boundedly, asking for a fresh LIST after the first miss:
`find` and `pod_state` are the only call sites' way in, so the retry is the same everywhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence, Set
from typing import TypeVar

from partkeeper import backoff
from partkeeper.bus import Unanswered
from partkeeper.bus.clients import WatcherClient
from partkeeper.lifecycle import cancel_all
from partkeeper.podstate import being_admitted
from schemas import PodRecord, PodsGetReply
from schemas.pods import InvalidPodUID, validate_pod_uid
from services.allocator.core import patience
from services.allocator.core.context import Context
from services.allocator.core.podresources import KubeletView
from services.allocator.core.writes import Target

log = logging.getLogger(__name__)
T = TypeVar("T")


class LookupFailed(Exception):
    """The Pod could not be found or its state not learned within the bounded retry."""


def candidates(
    pods: Sequence[PodRecord], resource: str, quantity: int, claimed: Set[tuple[str, str]]
) -> list[Target]:
    """Unclaimed containers requesting exactly `quantity` of `resource`, in admission order."""
    found: list[Target] = []
    for pod in pods:
        try:
            validate_pod_uid(pod.uid)
        except InvalidPodUID as exc:
            log.warning("pods.pending listed a Pod with a malformed UID; skipped: %s", exc)
            continue
        for container in pod.containers:
            if container.requests.get(resource) != quantity:
                continue
            if (pod.uid, container.name) in claimed:
                continue
            found.append(Target(pod.uid, pod.namespace, pod.name, container.name))
    return found


def narrow(found: Sequence[Target], kubelet: KubeletView, resource: str) -> list[Target]:
    """Those of Pods kubelet lists (it lists only active Pods) whose container it lists without
    devices of `resource`, or does not list at all: pod-resources never lists (non-sidecar)
    init containers, which kubelet allocates first."""
    kept = []
    for t in found:
        pod = kubelet.get((t.namespace, t.name))
        if pod is not None and resource not in pod.get(t.container, frozenset()):
            kept.append(t)
    return kept


def first_per_pod(found: Sequence[Target]) -> list[Target]:
    """Within one Pod kubelet allocates in a fixed order (init containers, then the others, in
    spec order, as the watcher lists them), so only the first unclaimed container of each Pod
    is a candidate; several Pods left is an ambiguity."""
    first: dict[str, Target] = {}
    for target in found:
        first.setdefault(target.uid, target)
    return list(first.values())


def survivors(
    pods: Sequence[PodRecord],
    resource: str,
    quantity: int,
    claimed: Set[tuple[str, str]],
    kubelet: KubeletView | None,
) -> list[Target]:
    """The candidates left after narrowing, in admission order; one is the answer, several are
    confirmed with the watcher and waited on, none is retried."""
    found = candidates(pods, resource, quantity, claimed)
    return first_per_pod(found if kubelet is None else narrow(found, kubelet, resource))


async def find(
    ctx: Context, resource: str, quantity: int, claimed: Set[tuple[str, str]]
) -> Target:
    """The container this Allocate serves. Raises LookupFailed naming what was seen.

    Retries boundedly (the lookup policy) while no candidate is seen; while several remain after
    narrowing and fresh confirmation, waits up to `choose_wait_seconds` for them to narrow to
    one, then refuses rather than guesses.
    """
    choose_until = asyncio.get_running_loop().time() + ctx.options.choose_wait_seconds
    policy = ctx.options.lookup
    until = patience.deadline(ctx)
    looks = 0
    found: list[Target] = []

    async def look() -> Target | backoff.Again:
        nonlocal looks, found
        looks += 1
        found, seen = await _look(ctx, resource, quantity, claimed, fresh=looks > 1, until=until)
        if len(found) == 1:
            return found[0]
        return backoff.Again(seen, until=choose_until if found else None)

    try:
        return await backoff.retry(
            f"finding the Pod an Allocate of {quantity} x {resource} serves", look,
            schedule=policy.delay, attempts=policy.attempts, level=logging.INFO)
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
) -> tuple[list[Target], str]:
    """One look: the candidates that survive narrowing and confirmation, and what was seen.
    The watcher's list and kubelet's view are independent reads, made side by side."""
    viewing = asyncio.create_task(ctx.podres.view(), name="pod-resources view")
    try:
        reply = await patience.answered(until, "pods.pending", lambda: _watcher(ctx).pending(
            resource, quantity, fresh=fresh))
    except Unanswered as exc:
        await cancel_all([viewing])
        return [], f"the watcher's pods.pending failed: {exc}"
    except BaseException:
        await cancel_all([viewing])  # cancelled: the view must not outlive the lookup
        raise
    kubelet = await viewing
    found = survivors(reply.pods, resource, quantity, claimed, kubelet)
    if len(found) > 1:
        found = await confirm(ctx, found)
    listed = ", ".join(f"{p.namespace}/{p.name}" for p in reply.pods) or "none"
    narrowed = "" if kubelet is None else " kubelet is admitting none of them;"
    return found, f"pending Pods listed: {listed};{narrowed} claimed ones excluded"


async def confirm(ctx: Context, found: Sequence[Target]) -> list[Target]:
    """Those the watcher, asked afresh, still knows as being admitted (no answer: kept)."""

    async def still(target: Target) -> bool:
        try:
            answer = await pod_state(ctx, target.uid, fresh=True)
        except LookupFailed as exc:
            log.info("%s; %s stays a candidate", exc, target)
            return True
        return being_admitted(answer.pod)

    keep = await asyncio.gather(*(still(t) for t in found))
    return [t for t, kept in zip(found, keep, strict=True) if kept]


async def pod_state(ctx: Context, uid: str, *, fresh: bool = True) -> PodsGetReply:
    """The watcher's answer about one Pod (fresh: confirmed with the API server)."""
    until = patience.deadline(ctx)
    policy = ctx.options.lookup
    try:
        return await backoff.retry(
            f"asking the watcher about Pod {uid}",
            lambda: patience.answered(until, f"pods.get {uid}",
                                      lambda: _watcher(ctx).pod(uid, fresh=fresh)),
            transient=lambda exc: isinstance(exc, Unanswered),
            schedule=policy.delay, attempts=policy.attempts, level=logging.INFO)
    except Unanswered as exc:
        raise LookupFailed(f"the watcher did not say whether Pod {uid} is live ({exc}), after "
                           f"{policy.attempts} attempts") from None


def _watcher(ctx: Context) -> WatcherClient:
    return WatcherClient(ctx.nc, ctx.node, ctx.options.lookup.timeout)
