"""What a container gets: the Allocate response and the partition descriptor (pure builders).

Partitions: the container edits the driver gives for them (NVIDIA and the sim:
`NVIDIA_VISIBLE_DEVICES` = the MIG device UUID(s) exactly as the driver reported them, comma
separated in token order, plus, from the nvml driver, the device specs NVIDIA's device plugin
passes; T-Head: device nodes; Hygon: device nodes, mounts and `DMI_MIG_VISIBLE_DEVICE`), `PK_*`
variables describing the partition(s) and, with the CDI strategy, their CDI device names (see
handoff.py). Slices: the container edits the driver gives for the whole cards they sit on
(NVIDIA and the sim's NVIDIA cards: `NVIDIA_VISIBLE_DEVICES` = the card UUIDs, plus, from the nvml
driver, the cards' device specs; T-Head and Hygon: their vendors' nodes, and Hygon's runtime
mount), the limits, and mounts of the limiter file (read-only) and the cache dir, plus the slice
limiter's env and mounts (`PK_SLICE_LIMITER=hami-core`: HAMi-core's, partkeeper/limiter.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from partkeeper.drivers import Card, profiles
from partkeeper.drivers.base import ContainerEdits
from partkeeper.kubelet import deviceplugin_pb2 as pb
from schemas import Claim


class PartitionDescriptor(msgspec.Struct, frozen=True, kw_only=True):
    """`partition-<MIG uuid>.json`: which claim and Pod a partition belongs to (the allocator
    writes it, the reclaimer removes it after the destroy)."""

    claim_id: str
    pod_uid: str
    namespace: str
    name: str
    container: str
    resource: str
    card: int
    card_uuid: str
    profile: str
    start: int
    size: int
    gi_id: int
    ci_id: int
    uuid: str
    created_at: float


def descriptor(claim: Claim, card: Card) -> PartitionDescriptor:
    if claim.instance is None:
        raise ValueError(f"claim {claim.id} has no instance to describe")
    return PartitionDescriptor(
        claim_id=claim.id, pod_uid=claim.pod_uid, namespace=claim.namespace, name=claim.name,
        container=claim.container, resource=claim.resource, card=claim.card, card_uuid=card.uuid,
        profile=claim.profile, start=claim.start, size=claim.size, gi_id=claim.instance.gi_id,
        ci_id=claim.instance.ci_id, uuid=claim.instance.uuid, created_at=claim.created_at,
    )


def in_token_order(claims: Sequence[Claim], tokens: Sequence[str]) -> list[Claim]:
    rank = {t: i for i, t in enumerate(tokens)}
    return sorted(claims, key=lambda c: min((rank.get(t, len(rank)) for t in c.device_ids),
                                            default=len(rank)))


def too_many_for_one_container(models: Sequence[str], quantity: int) -> str | None:
    """Why `quantity` partitions on cards of these models cannot go to one container, or None.

    T-Head's and Hygon's runtimes make exactly one partition visible to a container, so a request
    for more is refused before anything is claimed or created."""
    vendors = {m.vendor for m in map(profiles.MODELS.get, models) if m is not None}
    single = sorted(vendors & profiles.ONE_PARTITION_PER_CONTAINER)
    if quantity <= 1 or not single:
        return None
    return (f"a container can use exactly one {'/'.join(single)} partition and this one asked for "
            f"{quantity}; request one partition per container")


def partition_response(
    claims: Sequence[Claim], edits: ContainerEdits, cdi_names: Sequence[str] = ()
) -> pb.ContainerAllocateResponse:
    uuids = []
    for c in claims:
        if c.instance is None:
            raise ValueError("every claim must be active with an instance before replying")
        uuids.append(c.instance.uuid)
    first = claims[0]
    envs = {
        **edits.env,
        "PK_RESOURCE": first.resource,
        "PK_PARTITION_PROFILE": first.profile,
        "PK_PARTITION_UUIDS": ",".join(uuids),
        "PK_PARTITION_CARDS": ",".join(str(c.card) for c in claims),
        "PK_PARTITION_PLACEMENTS": ",".join(f"{c.start}+{c.size}" for c in claims),
        "PK_CLAIM_IDS": ",".join(c.id for c in claims),
        "PK_POD_UID": first.pod_uid,
    }
    cdi_devices = [pb.CDIDevice(name=name) for name in cdi_names]
    return pb.ContainerAllocateResponse(envs=envs, devices=_devices(edits), mounts=_mounts(edits),
                                        cdi_devices=cdi_devices)


def _devices(edits: ContainerEdits) -> list[pb.DeviceSpec]:
    return [pb.DeviceSpec(container_path=n.container_path, host_path=n.host_path,
                          permissions=n.permissions) for n in edits.devices]


def _mounts(edits: ContainerEdits) -> list[pb.Mount]:
    return [pb.Mount(container_path=m.container_path, host_path=m.host_path,
                     read_only=m.read_only) for m in edits.mounts]


def slice_response(
    edits: ContainerEdits, cdi_names: Sequence[str] = ()
) -> pb.ContainerAllocateResponse:
    """The reply of a slice container from its `slices.slice_edits`."""
    return pb.ContainerAllocateResponse(
        envs=dict(edits.env), devices=_devices(edits), mounts=_mounts(edits),
        cdi_devices=[pb.CDIDevice(name=name) for name in cdi_names],
    )
