"""What a container gets: the Allocate response and the partition descriptor (pure builders).

Partitions: `NVIDIA_VISIBLE_DEVICES` is the MIG device UUID(s) exactly as the driver reported
them, comma separated in token order, plus `PK_*` variables describing the partition(s), the
device specs of the nvml driver's partitions and, with the CDI strategy, their CDI device names
(see handoff.py). Slices:
the card UUID(s), the limits, and mounts of the limiter file (read-only) and the cache dir.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from partkeeper.devices import DeviceNode
from partkeeper.drivers import Card
from partkeeper.kubelet import deviceplugin_pb2 as pb
from partkeeper.workdir import sliced_dir
from schemas import Claim
from services.allocator.slices import CACHE_DIR, LIMITS_FILE, SliceConfig

CONTAINER_SLICED_DIR = "/var/run/partkeeper/sliced"


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


def partition_response(
    claims: Sequence[Claim], nodes: Sequence[DeviceNode] = (), cdi_names: Sequence[str] = ()
) -> pb.ContainerAllocateResponse:
    uuids = [c.instance.uuid for c in claims if c.instance is not None]
    if len(uuids) != len(claims):
        raise ValueError("every claim must be active with an instance before replying")
    first = claims[0]
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(uuids),
        "PK_RESOURCE": first.resource,
        "PK_PARTITION_PROFILE": first.profile,
        "PK_PARTITION_UUIDS": ",".join(uuids),
        "PK_PARTITION_CARDS": ",".join(str(c.card) for c in claims),
        "PK_PARTITION_PLACEMENTS": ",".join(f"{c.start}+{c.size}" for c in claims),
        "PK_CLAIM_IDS": ",".join(c.id for c in claims),
        "PK_POD_UID": first.pod_uid,
    }
    devices = [
        pb.DeviceSpec(container_path=n.container_path, host_path=n.host_path,
                      permissions=n.permissions)
        for n in nodes
    ]
    cdi_devices = [pb.CDIDevice(name=name) for name in cdi_names]
    return pb.ContainerAllocateResponse(envs=envs, devices=devices, cdi_devices=cdi_devices)


def slice_response(
    claims: Sequence[Claim], config: SliceConfig, pods_dir: Path
) -> pb.ContainerAllocateResponse:
    first = claims[0]
    host = sliced_dir(pods_dir, first.pod_uid, first.container)
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(config.card_uuids),
        "PK_RESOURCE": first.resource,
        "PK_SLICE_INDEXES": ",".join(str(i) for i in config.slices),
        "PK_SLICE_MEMORY_MIB": str(config.memory_mib),
        "PK_SLICE_COMPUTE_PERCENT": str(config.compute_percent),
        "PK_SLICE_CONFIG": f"{CONTAINER_SLICED_DIR}/{LIMITS_FILE}",
        "PK_SLICE_CACHE_DIR": f"{CONTAINER_SLICED_DIR}/{CACHE_DIR}",
        "PK_CLAIM_IDS": ",".join(c.id for c in claims),
        "PK_POD_UID": first.pod_uid,
    }
    mounts = [
        pb.Mount(container_path=f"{CONTAINER_SLICED_DIR}/{LIMITS_FILE}",
                 host_path=str(host / LIMITS_FILE), read_only=True),
        pb.Mount(container_path=f"{CONTAINER_SLICED_DIR}/{CACHE_DIR}",
                 host_path=str(host / CACHE_DIR), read_only=False),
    ]
    return pb.ContainerAllocateResponse(envs=envs, mounts=mounts)
