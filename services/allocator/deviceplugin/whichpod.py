"""Which Pod and container an Allocate serves: pure decisions over what the shell gathered
(`podmatch.py` asks the watcher and kubelet; `allocate.py` acts on the answer).

kubelet does not say which container an Allocate is for. Two questions answer it:

- **Is it kubelet's retry?** kubelet passes the same device IDs again for the same container;
  those IDs are on the claims it got the first time (invariant 7): `existing`, `missing`. kubelet
  re-calls `Allocate` for a container only while it still admits that container: its Pod is
  Pending and, when the pod-resources API answers, kubelet lists the container without devices of
  the resource. A token handed out again otherwise was freed: the holder's containers stopped
  (kubelet frees devices at once, while the status reaches the API server later) or the holder
  was rejected. Only a retry gets the claim's partition (`holder`); anything else is a new
  allocation for the Pod kubelet is admitting now.
- **Otherwise, which pending container?** The watcher lists the pending Pods of this node
  requesting the resource in that quantity, oldest first by (creationTimestamp, namespace, name),
  as kubelet admits them. Containers that already hold a claim are skipped; when kubelet's
  pod-resources API answers, only containers it lists without devices of that resource remain
  (the one it is admitting right now): `survivors`, then `chosen`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence, Set
from enum import Enum

from schemas import Claim, PodRecord
from schemas.pods import InvalidPodUID, validate_pod_uid
from services.allocator.core.podresources import KubeletView
from services.allocator.core.writes import Target

log = logging.getLogger(__name__)


class Holder(Enum):
    """What the claims carrying an Allocate's device IDs mean."""

    RETRY = "retry"  # the same container asks again: return (or complete) its partition
    DEAD = "dead"  # the holder is confirmed finished or gone: its room is reclaimable
    HANDED_ON = "handed on"  # the holder looks live but kubelet freed its tokens


def existing(claims: Iterable[Claim], resource: str, device_ids: Sequence[str]) -> list[Claim]:
    """The creating/active claims of one container that carry these device IDs.

    A token carried by several claims (kubelet re-used it after its first holder stopped) belongs
    to the newest. Empty when no claim carries them, or when they are spread over several
    containers' claims: then kubelet re-used freed tokens and this is a new allocation. Claims
    carrying only some of the IDs are a group whose writing was cut short (a crash between the
    claim writes) only when all of them are still `creating`; see `missing`.
    """
    wanted = set(device_ids)
    newest: dict[str, Claim] = {}
    for claim in claims:
        if claim.resource != resource or claim.state not in ("creating", "active"):
            continue
        for token in wanted.intersection(claim.device_ids):
            current = newest.get(token)
            if current is None or (claim.created_at, claim.id) > (current.created_at, current.id):
                newest[token] = claim
    mine = list({c.id: c for c in newest.values()}.values())
    if not mine:
        return []
    owners = {(c.pod_uid, c.container) for c in mine}
    carried = {t for c in mine for t in c.device_ids}
    if len(owners) != 1 or not carried <= wanted:
        return []
    if carried != wanted and any(c.state != "creating" for c in mine):
        return []
    return mine


def missing(group: Iterable[Claim], device_ids: Sequence[str]) -> list[str]:
    """The IDs of a retried Allocate that no claim of its group carries yet, in their order."""
    carried = {t for c in group for t in c.device_ids}
    return [t for t in device_ids if t not in carried]


def admitting(kubelet: KubeletView | None, claim: Claim) -> bool:
    """kubelet still admits the claim's Pod (or cannot say): it lists the Pod (pod-resources
    lists only active Pods) and the claim's container without devices of its resource, or not
    at all: an init container, never listed, whose devices kubelet hands to the containers
    after it with the same IDs, so they get the same partition."""
    if kubelet is None:
        return True
    containers = kubelet.get((claim.namespace, claim.name))
    if containers is None:
        return False
    return claim.resource not in containers.get(claim.container, frozenset())


def holder(
    claim: Claim, *, dead: bool, being_admitted: bool, kubelet: KubeletView | None
) -> Holder:
    """What the claim carrying the device IDs means. `dead`: the Pod view or the watcher, asked
    afresh, says its Pod finished or is gone; `being_admitted`: the watcher's fresh answer says
    the Pod is still being admitted; `kubelet`: the pod-resources view (None: no answer)."""
    if dead:
        return Holder.DEAD
    if being_admitted and admitting(kubelet, claim):
        return Holder.RETRY
    return Holder.HANDED_ON


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


def chosen(found: Sequence[Target]) -> Target | None:
    """The container the Allocate serves: the one candidate left, or None (none, or several:
    a wrong guess hands one Pod's partition to another, so several are never chosen from)."""
    return found[0] if len(found) == 1 else None


def handed_on(claim: Claim, target: Target, ids: Sequence[str]) -> str:
    """The first half of a refusal for room a handed-on token's holder still takes."""
    return (
        f"kubelet handed device IDs {','.join(ids)} to {target}, but claim {claim.id} of Pod "
        f"{claim.namespace}/{claim.name} ({claim.pod_uid}) holds them and the API server "
        "still shows that Pod live (kubelet saw its containers stop before its status was "
        "reported); "
    )
