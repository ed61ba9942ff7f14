"""Handing active partitions to the container: the driver's container edits, device nodes and,
with the CDI strategy, specs.

Every driver says what its vendor's container needs (`driver.container_edits`: env, device nodes,
mounts; docs/drivers.md, Container edits); the nvml driver's partitions also get the device specs
NVIDIA's device plugin passes (card node, the two MIG capability nodes, the control nodes; see
partkeeper/devices.py); the sim driver has no device nodes. With `PK_DEVICE_LIST_STRATEGY=cdi`
each partition also gets a CDI spec in `PK_CDI_DIR` (partkeeper/cdi.py) carrying its container
edits, named by its claim id, returned in `cdi_devices`. Runs after the claims are active and the
descriptors written; a retried Allocate writes the same bytes again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from partkeeper import cdi
from partkeeper.devices import DeviceNode, DeviceNodeError, Roots, partition_nodes
from partkeeper.drivers.base import ContainerEdits, DriverError
from schemas import Claim
from services.allocator import reply
from services.allocator.context import Context
from services.allocator.refusal import Refusal, Result


async def _nodes(ctx: Context, claim: Claim) -> list[DeviceNode]:
    if ctx.driver.name != "nvml" or claim.instance is None:
        return []
    card = ctx.card(claim.card)
    minor = card.minor if card.minor is not None else card.index
    roots = Roots(ctx.config.driver_root, ctx.config.proc_root)
    live = claim.instance
    try:
        return await asyncio.to_thread(partition_nodes, roots, minor, live.gi_id, live.ci_id)
    except DeviceNodeError as exc:
        raise Refusal(Result.UNAVAILABLE, f"partition {live.uuid} of Pod {claim.namespace}/"
                      f"{claim.name} ({claim.pod_uid}) is made (claim {claim.id}, active) but its "
                      f"device nodes cannot be named: {exc}; kubelet may retry") from exc


async def _edits(ctx: Context, claims: Sequence[Claim]) -> ContainerEdits:
    """The driver's container edits for `claims`; a refusal is a sentence (the claims stay active,
    so kubelet's retry gets the same partitions and asks again)."""
    try:
        return await ctx.hardware(ctx.driver.container_edits, reply.instances_of(claims))
    except DriverError as exc:
        first = claims[0]
        raise Refusal(Result.UNAVAILABLE, f"the partition(s) of claim(s) "
                      f"{','.join(c.id for c in claims)} of Pod {first.namespace}/{first.name} "
                      f"({first.pod_uid}) are made but {exc}; kubelet may retry") from exc


async def prepare(ctx: Context, claims: Sequence[Claim]) -> tuple[ContainerEdits, list[str]]:
    """The container edits of `claims` (device nodes each once) and the qualified CDI names
    written for them."""
    edits = await _edits(ctx, claims)
    nodes: list[DeviceNode] = list(edits.devices)
    names: list[str] = []
    for claim in claims:
        mine = await _nodes(ctx, claim)
        nodes.extend(n for n in mine if n not in nodes)
        if ctx.config.device_list_strategy != "cdi" or claim.instance is None:
            continue
        own = edits if len(claims) == 1 else await _edits(ctx, [claim])
        env = {"PK_CLAIM_IDS": claim.id, "PK_POD_UID": claim.pod_uid}
        spec = cdi.spec_for(claim.id, claim.instance.uuid, [*own.devices, *mine], env,
                            vendor_env=own.env, mounts=own.mounts)
        try:
            await asyncio.to_thread(cdi.write_spec, ctx.config.cdi_dir, claim.id, spec)
        except cdi.CdiError as exc:
            raise Refusal(Result.UNAVAILABLE, f"partition {claim.instance.uuid} (claim "
                          f"{claim.id}, active) is made but {exc}; kubelet may retry") from exc
        names.append(cdi.qualified(claim.id))
    return replace(edits, devices=tuple(nodes)), names
