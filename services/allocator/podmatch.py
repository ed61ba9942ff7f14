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
from collections.abc import Awaitable, Callable, Sequence, Set
from dataclasses import dataclass
from typing import TypeVar

from partkeeper.bus import Unanswered
from partkeeper.bus.clients import WatcherClient
from schemas import PodRecord, PodsGetReply
from schemas.pods import InvalidPodUID, validate_pod_uid
from services.allocator import patience
from services.allocator.context import Context
from services.allocator.options import LookupPolicy
from services.allocator.podresources import KubeletView

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Target:
    uid: str
    namespace: str
    name: str
    container: str

    def __str__(self) -> str:
        return f"Pod {self.namespace}/{self.name} ({self.uid}) container {self.container}"


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
    """Those kubelet lists without devices of `resource`: the container it is admitting."""
    return [
        t
        for t in found
        if t.container in kubelet.get((t.namespace, t.name), {})
        and resource not in kubelet[(t.namespace, t.name)][t.container]
    ]


def choose(
    pods: Sequence[PodRecord],
    resource: str,
    quantity: int,
    claimed: Set[tuple[str, str]],
    kubelet: KubeletView | None,
) -> Target | None:
    found = candidates(pods, resource, quantity, claimed)
    if kubelet is not None:
        found = narrow(found, kubelet, resource)
    return found[0] if found else None


async def retrying(
    policy: LookupPolicy, what: str, attempt_once: Callable[[int], Awaitable[T | None]]
) -> T:
    """Call `attempt_once(n)` until it returns a value, at most `policy.attempts` times."""
    for attempt in range(1, policy.attempts + 1):
        result = await attempt_once(attempt)
        if result is not None:
            return result
        if attempt < policy.attempts:
            await asyncio.sleep(policy.delay(attempt))
    raise LookupFailed(f"{what}, after {policy.attempts} attempts")


async def find(
    ctx: Context, resource: str, quantity: int, claimed: Set[tuple[str, str]]
) -> Target:
    """The container this Allocate serves. Raises LookupFailed naming what was seen."""
    seen: list[str] = []
    until = patience.deadline(ctx)

    async def once(attempt: int) -> Target | None:
        try:
            reply = await patience.answered(until, "pods.pending", lambda: _watcher(ctx).pending(
                resource, quantity, fresh=attempt > 1))
        except Unanswered as exc:
            seen[:] = [f"the watcher's pods.pending failed: {exc}"]
            return None
        kubelet = await ctx.podres.view()
        target = choose(reply.pods, resource, quantity, claimed, kubelet)
        if target is None:
            listed = ", ".join(f"{p.namespace}/{p.name}" for p in reply.pods) or "none"
            narrowed = "" if kubelet is None else " kubelet is admitting none of them;"
            seen[:] = [f"pending Pods listed: {listed};{narrowed} claimed ones excluded"]
        return target

    try:
        return await retrying(ctx.options.lookup, "", once)
    except LookupFailed as exc:
        raise LookupFailed(
            f"no pending Pod on node {ctx.node} waits for {quantity} x {resource} "
            f"({'; '.join(seen)}){exc}"
        ) from None


async def pod_state(ctx: Context, uid: str, *, fresh: bool = True) -> PodsGetReply:
    """The watcher's answer about one Pod (fresh: confirmed with the API server)."""
    problem: list[str] = []
    until = patience.deadline(ctx)

    async def once(_attempt: int) -> PodsGetReply | None:
        try:
            return await patience.answered(until, f"pods.get {uid}",
                                           lambda: _watcher(ctx).pod(uid, fresh=fresh))
        except Unanswered as exc:
            problem[:] = [str(exc)]
            return None

    try:
        return await retrying(ctx.options.lookup, "", once)
    except LookupFailed as exc:
        raise LookupFailed(f"the watcher did not say whether Pod {uid} is live "
                           f"({'; '.join(problem)}){exc}") from None


def _watcher(ctx: Context) -> WatcherClient:
    return WatcherClient(ctx.nc, ctx.node, ctx.options.lookup.timeout)
