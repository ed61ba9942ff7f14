"""Asking the watcher and kubelet about the Pods an Allocate may serve: the I/O behind
`decide.which_pod`, which this module never calls (the shell, `allocate.py`, hands it what was
asked here). A watcher that gives no usable answer to `pods.get` (during a JetStream election it
cannot persist what its fresh LIST saw) is asked again until the Allocate's deadline (`until`,
loop time, set once in `allocate.py`).

kubelet's pod-resources API (`PodResources`) narrows which container an Allocate serves: while
kubelet waits for our Allocate, it lists the container it is admitting without devices of that
resource; containers already served list theirs. The answer is optional: when the socket is
absent or the call fails, the lookup goes on without narrowing (and says so in its log).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import grpc
import grpc.aio

from partkeeper.bus import Unanswered
from partkeeper.bus.clients import WatcherClient
from partkeeper.kubelet import open_unix_channel, podresources_pb2, podresources_pb2_grpc
from partkeeper.lifecycle import cancel_all
from partkeeper.podstate import being_admitted, is_dead
from schemas import Claim, PodsGetReply
from services.allocator.core import state
from services.allocator.core.placement import Target
from services.allocator.core.refusal import Refusal, Result
from services.allocator.core.state import Context
from services.allocator.deviceplugin.decide import HolderSeen, KubeletView, Looked, after_reboot

log = logging.getLogger(__name__)


class LookupFailed(Exception):
    """The Pod could not be found or its state not learned by the Allocate's deadline."""


async def look(
    ctx: Context, kubelet: PodResources, resource: str, quantity: int, *, fresh: bool
) -> Looked:
    """One look at the Pods an Allocate may serve: the watcher's pending list (a fresh LIST when
    `fresh`) and kubelet's pod-resources view, read side by side (independent reads)."""
    viewing = asyncio.create_task(kubelet.view(), name="pod-resources view")
    try:
        reply = await _watcher(ctx).pending(resource, quantity, fresh=fresh)
    except Unanswered as exc:
        await cancel_all([viewing])
        # A refused request is a miss like any other; no answer is asked again until `until`.
        return Looked(answered=not state.unanswered(exc),
                      problem=f"the watcher's pods.pending failed: {exc}")
    except BaseException:
        await cancel_all([viewing])  # cancelled: the view must not outlive the lookup
        raise
    return Looked(answered=True, pods=tuple(reply.pods), kubelet=await viewing)


async def confirm(ctx: Context, found: Sequence[Target]) -> frozenset[str]:
    """The UIDs of those the watcher, asked afresh once, still knows as being admitted (no
    usable answer: kept). Asked once, not again: the lookup that asks is itself looked again
    while several remain (`allocate.py`), so a retry here would be a retry inside a retry."""

    async def still(target: Target) -> bool:
        try:
            answer = await _watcher(ctx).pod(target.uid, fresh=True)
        except Unanswered as exc:
            log.info("the watcher did not say whether Pod %s is live (%s); %s stays a "
                     "candidate", target.uid, exc, target)
            return True
        return being_admitted(answer.pod)

    keep = await asyncio.gather(*(still(t) for t in found))
    return frozenset(t.uid for t, kept in zip(found, keep, strict=True) if kept)


async def pod_state(ctx: Context, uid: str, until: float) -> PodsGetReply:
    """The watcher's answer about one Pod, confirmed with the API server, asked again while it
    gives no usable answer, until `until`."""
    try:
        return await state.answered(until, f"pods.get {uid}",
                                    lambda: _watcher(ctx).pod(uid, fresh=True))
    except Unanswered as exc:
        raise LookupFailed(f"the watcher did not say whether Pod {uid} is live ({exc})") from None


async def holder(
    ctx: Context, kubelet: PodResources, group: Sequence[Claim], until: float
) -> HolderSeen:
    """What the watcher, asked afresh, and kubelet say of the Pod holding an Allocate's device
    IDs (`decide.holder` judges it). Refuses when the watcher cannot say whether it is live."""
    first = group[0]
    if ctx.pods.dead(first.pod_uid):
        return HolderSeen(dead=True, being_admitted=False, kubelet=None)
    try:
        answer = await pod_state(ctx, first.pod_uid, until)
    except LookupFailed as exc:
        raise Refusal(Result.UNAVAILABLE, f"device IDs {','.join(first.device_ids)} are held "
                      f"by claim {first.id} of Pod {first.namespace}/{first.name}; {exc}, so "
                      "a retry cannot be told from a re-use; nothing was claimed").about(
            first.pod_uid, first.namespace, first.name) from exc
    if is_dead(answer.state):
        return HolderSeen(dead=True, being_admitted=False, kubelet=None)
    admitted = being_admitted(answer.pod)
    asked = admitted or after_reboot(first)  # kubelet's view decides both (decide.holder)
    return HolderSeen(dead=False, being_admitted=admitted,
                      kubelet=await kubelet.view() if asked else None)


def _watcher(ctx: Context) -> WatcherClient:
    return WatcherClient(ctx.nc, ctx.node, ctx.options.lookup.timeout)


class PodResources:
    def __init__(self, socket: Path, *, timeout: float = 1.0) -> None:
        self.socket = Path(socket)
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    async def view(self) -> KubeletView | None:
        """Every Pod kubelet knows with its containers' device holdings; None when unavailable."""
        if not self.socket.exists():
            return None
        if self._channel is None:
            self._channel = open_unix_channel(self.socket)
        stub = podresources_pb2_grpc.PodResourcesListerStub(self._channel)
        try:
            reply = await stub.List(podresources_pb2.ListPodResourcesRequest(),
                                    timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            log.info("pod-resources at %s did not answer (%s); not narrowing", self.socket,
                     exc.code().name)
            await self.close()
            return None
        return {
            (pod.namespace, pod.name): {
                c.name: frozenset(d.resource_name for d in c.devices if d.device_ids)
                for c in pod.containers
            }
            for pod in reply.pod_resources
        }

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()
