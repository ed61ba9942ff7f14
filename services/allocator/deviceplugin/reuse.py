"""Is an Allocate whose device IDs a claim already carries kubelet's retry, or a re-use?

kubelet re-calls `Allocate` for a container only while it is still admitting that container: its
Pod is Pending and, when the pod-resources API answers, kubelet lists the container without
devices of the resource. A token it hands out again otherwise was freed: the holder's containers
stopped (kubelet frees devices at once, while the status reaches the API server later) or the
holder was rejected. Only a retry gets the claim's partition; everything else is a new allocation
for the Pod kubelet is admitting now, and the holder's room is made or waited for as usual.
"""

from __future__ import annotations

from enum import Enum

from partkeeper.podstate import being_admitted, is_dead
from schemas import Claim
from services.allocator.core.context import Context
from services.allocator.core.refusal import Refusal, Result
from services.allocator.core.writes import Target
from services.allocator.deviceplugin import podmatch


class Holder(Enum):
    RETRY = "retry"  # the same container asks again: return (or complete) its partition
    DEAD = "dead"  # the holder is confirmed finished or gone: its room is reclaimable
    HANDED_ON = "handed on"  # the holder looks live but kubelet freed its tokens


async def judge(ctx: Context, group: list[Claim]) -> Holder:
    """What the claims carrying an Allocate's device IDs mean, asked afresh of the watcher."""
    first = group[0]
    if ctx.pods.dead(first.pod_uid):
        return Holder.DEAD
    try:
        answer = await podmatch.pod_state(ctx, first.pod_uid, fresh=True)
    except podmatch.LookupFailed as exc:
        raise Refusal(Result.UNAVAILABLE, f"device IDs {','.join(first.device_ids)} are held "
                      f"by claim {first.id} of Pod {first.namespace}/{first.name}; {exc}, so "
                      "a retry cannot be told from a re-use; nothing was claimed").about(
            first.pod_uid, first.namespace, first.name) from exc
    if is_dead(answer.state):
        return Holder.DEAD
    if being_admitted(answer.pod) and await _kubelet_admitting(ctx, first):
        return Holder.RETRY
    return Holder.HANDED_ON


async def _kubelet_admitting(ctx: Context, claim: Claim) -> bool:
    """kubelet still admits the claim's Pod (or cannot say): it lists the Pod (pod-resources
    lists only active Pods) and the claim's container without devices of its resource, or not
    at all: an init container, never listed, whose devices kubelet hands to the containers
    after it with the same IDs, so they get the same partition."""
    view = await ctx.podres.view()
    if view is None:
        return True
    containers = view.get((claim.namespace, claim.name))
    if containers is None:
        return False
    return claim.resource not in containers.get(claim.container, frozenset())


def handed_on(holder: Claim, target: Target, ids: list[str]) -> str:
    """The first half of a refusal for room a handed-on token's holder still takes."""
    return (
        f"kubelet handed device IDs {','.join(ids)} to {target}, but claim {holder.id} of Pod "
        f"{holder.namespace}/{holder.name} ({holder.pod_uid}) holds them and the API server "
        "still shows that Pod live (kubelet saw its containers stop before its status was "
        "reported); "
    )
