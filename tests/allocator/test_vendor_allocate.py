"""Allocate on T-Head and Hygon cards (the sim modelling them): the vendor's container edits reach
the reply, and a request for more partitions than one container can use is refused before
anything is claimed."""

from __future__ import annotations

import grpc
import pytest
from allocator.allocator_harness import FAST, MIG, node_stack

R2G = f"{MIG}2g.15gb"
B = "0b6c1f7e-3a2d-4e5f-9a8b-7c6d5e4f3a2b"


async def test_a_dcu_partition_reaches_the_container_through_hygon_s_variable(nc, js, node) -> None:
    async with node_stack(nc, node, cards=("DCU-64GB",)) as n:
        uid = await n.add_pod("a", {"main": {R2G: 1}})
        await n.phase(uid, "Running")
        [claim] = await n.claims_of(uid)
        reply = n.kubelet.record(uid).containers["main"].responses[R2G]
        assert claim.instance is not None
        assert reply.envs["DMI_MIG_VISIBLE_DEVICE"] == claim.instance.uuid
        assert "NVIDIA_VISIBLE_DEVICES" not in reply.envs
        assert reply.envs["PK_PARTITION_UUIDS"] == claim.instance.uuid


async def test_two_dcu_partitions_for_one_container_are_refused_unclaimed(nc, js, node) -> None:
    async with node_stack(nc, node, cards=("DCU-64GB",), options=FAST, pod_resources=False) as n:
        await n.watcher.add(n.watcher.record(B, "b", {"main": {R2G: 2}}))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await n.allocate(R2G, ["2g.15gb-0", "2g.15gb-1"])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "exactly one hygon partition" in refused.value.details()
        assert await n.claims() == [] and await n.instances() == []
