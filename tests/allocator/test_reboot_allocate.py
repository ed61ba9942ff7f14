"""The device-plugin Allocate after a host reboot, on one node (sim cards, real gRPC, the claims
store): kubelet asks again with the device IDs of a running Pod's claim that the reboot left
without a partition (docs/operations.md, "After a reboot"). The claim is written as the
allocator's start leaves it (`rebooted`; the start itself: tests/claims/test_boot.py)."""

from __future__ import annotations

import time
from dataclasses import replace

import grpc
import msgspec
import pytest

from partkeeper.workdir import descriptor_path, write_descriptor
from schemas import Claim, LiveInstance
from tests_support.allocator import FAST, MIG, Node, node_stack

R3 = MIG + "3g.40gb"
QUICK = replace(FAST, room_wait_seconds=0.5)
UID = "5d7f0c2e-9a1b-4c3d-8e7f-6a5b4c3d2e1f"
OLD_UUID = "MIG-0ld0ld00-0000-4000-8000-000000000000"


def rebooted(start: int) -> Claim:
    now = time.time()
    return Claim(id="kept", state="active", pod_uid=UID, namespace="default", name="running",
                 container="main", resource=R3, device_ids=["3g.40gb-1"], card=0,
                 profile="3g.40gb", start=start, size=4, created_at=now, updated_at=now,
                 instance=LiveInstance(gi_id=2, ci_id=0, uuid=OLD_UUID), rebooted=True)


async def running_pod(n: Node) -> None:
    await n.watcher.add(n.watcher.record(UID, "running", {"main": {R3: 1}}))
    await n.watcher.change(UID, phase="Running")  # the API server still shows it Running


@pytest.mark.parametrize("carved", [False, True], ids=["old placement free", "old one taken"])
async def test_kubelets_allocate_remakes_the_partition_and_a_retry_gets_the_same(
    nc, js, node, carved: bool
) -> None:
    # pod_resources=False: kubelet's pod-resources API does not answer (it would list the Pod).
    async with node_stack(nc, node, pod_resources=False) as n:
        await running_pod(n)
        await n.store.update(0, lambda d: msgspec.structs.replace(
            d, claims={"kept": rebooted(4)}))
        write_descriptor(n.config.pods_dir, UID, "main", OLD_UUID, b"{}")
        if carved:  # someone took the old placement since the reboot: the lowest legal one
            n.sim.carve(0, "3g.40gb", 4)

        first = await n.allocate(R3, ["3g.40gb-1"])
        again = await n.allocate(R3, ["3g.40gb-1"])

        [claim] = [c for c in await n.claims() if c.id == "kept"]
        assert (claim.state, claim.rebooted, claim.remakes) == ("active", False, 1)
        assert claim.start == (0 if carved else 4) and claim.device_ids == ["3g.40gb-1"]
        assert claim.instance is not None
        uuid = claim.instance.uuid
        assert first.envs["NVIDIA_VISIBLE_DEVICES"] == again.envs["NVIDIA_VISIBLE_DEVICES"] == uuid
        made = [i for i in await n.instances() if i.uuid == uuid]
        assert [(i.start, i.profile) for i in made] == [(claim.start, "3g.40gb")]
        # The old partition's descriptor went with it; the new one is written.
        assert not descriptor_path(n.config.pods_dir, UID, "main", OLD_UUID).exists()
        assert descriptor_path(n.config.pods_dir, UID, "main", uuid).exists()


async def test_a_remake_without_room_is_refused_and_changes_nothing(nc, js, node) -> None:
    async with node_stack(nc, node, options=QUICK, pod_resources=False) as n:
        await running_pod(n)
        await n.store.update(0, lambda d: msgspec.structs.replace(
            d, claims={"kept": rebooted(4)}))
        n.sim.carve(0, "3g.40gb", 0)
        n.sim.carve(0, "3g.40gb", 4)  # the card is full of foreign partitions
        before, _ = await n.store.read(0)

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await n.allocate(R3, ["3g.40gb-1"])

        assert "re-made as 3g.40gb, but card 0 has no free placement" in str(
            refused.value.details())
        after, _ = await n.store.read(0)
        assert after.claims == before.claims  # still rebooted, for kubelet's next try
        assert len(await n.instances()) == 2


async def test_a_rebooted_claim_of_a_finished_pod_is_not_remade(nc, js, node) -> None:
    # The Pod ended while the node was down: kubelet's Allocate with its IDs is for another
    # container (here: none pending), never a re-make of the ended Pod's partition.
    async with node_stack(nc, node, options=QUICK, pod_resources=False) as n:
        await running_pod(n)
        await n.watcher.finish(UID)
        await n.store.update(0, lambda d: msgspec.structs.replace(
            d, claims={"kept": rebooted(4)}))

        with pytest.raises(grpc.aio.AioRpcError):
            await n.allocate(R3, ["3g.40gb-1"])
        assert await n.instances() == []
        [claim] = await n.claims()
        assert claim.rebooted and claim.instance is not None and claim.instance.uuid == OLD_UUID


