"""`partkeeper_partition_info`: which Pod runs on which partition, for joins with GPU metrics.

The DCGM exporter labels its per-MIG-device series with the card's UUID (`UUID`) and the GPU
instance id (`GPU_I_ID`), and finds Pods through the kubelet's pod-resources API, which knows
nothing of partitions made at `Allocate` or prepare time. The allocator knows both ends: its
claims name the Pod and container, the driver's enumeration names the partition. So it exports
one series per partition and user, value 1, and dashboards join on the card UUID and GPU
instance id (docs/observability.md, "Pods on partitions").

`series` is the decision, pure: the label sets of a snapshot of claims and instances.
`PartitionInfo` is the shell: it sets those series and removes the ones that are gone, so a
series lives exactly as long as its partition (no stale series), and an allocator started
again rebuilds them on its first pass from the store and the driver.

Which partitions have a series: a claim that is `active` or `releasing` whose recorded instance
the driver lists on its card (same UUID). Not yet `creating` (it may never exist), not once
destroyed (the instance is gone even while the claim's removal is in flight), not a claim whose
instance a reboot or a hand removed, and no logical slice (no partition, nothing for DCGM to
report per instance). A lost card lists nothing and concludes nothing: its claims keep their
series from the instance they recorded. Foreign instances have no Pod and so no series.

Whose partition (labels `pod`, `namespace`, `container`):
- device-plugin mode: the claim's Pod and container, one series.
- DRA mode: a ResourceClaim's partition serves every container of every Pod that uses the claim.
  `users` (ResourceClaim UID -> users) gives them when the allocator knows them: one series per
  (Pod, container); a DCGM series then joins to each of them. Without that knowledge the series
  names the Pod the claim was prepared for, with `container` empty (the claim document records
  the ResourceClaim's request there, not a container).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import Gauge

from partkeeper.drivers import Instance
from schemas import Claim

# The label names, in the order the gauge declares them (the contract's order).
LABELS = ("uuid", "gpu_instance_id", "compute_instance_id", "card_uuid", "profile", "pod",
          "namespace", "container")
SHOWN_STATES = ("active", "releasing")


@dataclass(frozen=True, slots=True, order=True)
class User:
    """One container of one Pod using a partition."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True, order=True)
class Series:
    """One `partkeeper_partition_info` series: one partition as one container uses it."""

    uuid: str  # the MIG device UUID as the driver reports it (NVIDIA_VISIBLE_DEVICES)
    gpu_instance_id: str
    compute_instance_id: str
    card_uuid: str
    profile: str
    pod: str
    namespace: str
    container: str

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(getattr(self, name) for name in LABELS)


def users_of(claim: Claim, users: Mapping[str, Sequence[User]]) -> tuple[User, ...]:
    """Who uses the claim's partition (module docstring, "Whose partition")."""
    if not claim.resource_claim_uid:
        return (User(claim.namespace, claim.name, claim.container),)
    known = users.get(claim.resource_claim_uid)
    if known:
        return tuple(sorted(set(known)))
    return (User(claim.namespace, claim.name, ""),)


def series(
    claims: Iterable[Claim],
    instances: Mapping[int, Sequence[Instance]],
    card_uuids: Mapping[int, str],
    *,
    lost: frozenset[int] = frozenset(),
    users: Mapping[str, Sequence[User]] | None = None,
) -> frozenset[Series]:
    """The label sets of every partition's series (module docstring says which and whose)."""
    listed = {(card, inst.uuid): inst for card, found in instances.items() for inst in found}
    out: set[Series] = set()
    for claim in claims:
        recorded = claim.instance
        if claim.kind != "partition" or claim.state not in SHOWN_STATES or recorded is None:
            continue
        inst = listed.get((claim.card, recorded.uuid))
        if inst is not None:
            gi, ci = inst.gi_id, inst.ci_id
        elif claim.card in lost:
            gi, ci = recorded.gi_id, recorded.ci_id
        else:
            continue
        for user in users_of(claim, users or {}):
            out.add(Series(recorded.uuid, str(gi), str(ci), card_uuids.get(claim.card, ""),
                           claim.profile, user.pod, user.namespace, user.container))
    return frozenset(out)


class PartitionInfo:
    """Keeps a gauge's series equal to the last `series` given: new ones set to 1, gone ones
    removed. Owned by one recompute loop (not thread-safe beyond the gauge's own lock)."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self.shown: frozenset[Series] = frozenset()

    def show(self, wanted: frozenset[Series]) -> None:
        for gone in self.shown - wanted:
            self.gauge.remove(*gone.labels)
        for new in wanted - self.shown:
            self.gauge.labels(*new.labels).set(1)
        self.shown = wanted
