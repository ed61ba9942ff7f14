"""Allocate on T-Head and Hygon cards (the sim modelling them, and the real drivers over their
fake libraries for logical slices): the vendor's container edits reach the reply, and a request
for more partitions than one container can use is refused before anything is claimed."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from partkeeper.drivers import Driver
from tests_support import instance_of
from tests_support.allocator import FAST, MIG, node_stack
from tests_support.kubelet import pod_record
from tests_support.vendor_rigs import Rig, hygon_rig, open_dmi, open_hgml, thead_rig

R2G = f"{MIG}2g.15gb"
B = "0b6c1f7e-3a2d-4e5f-9a8b-7c6d5e4f3a2b"


async def test_a_dcu_partition_reaches_the_container_through_hygon_s_variable(nc, js, node) -> None:
    async with node_stack(nc, node, cards=("DCU-64GB",)) as n:
        uid = await n.add_pod("a", {"main": {R2G: 1}})
        await n.phase(uid, "Running")
        [claim] = await n.claims_of(uid)
        reply = pod_record(n.kubelet, uid).containers["main"].responses[R2G]
        assert claim.instance is not None
        assert reply.envs["DMI_MIG_VISIBLE_DEVICE"] == instance_of(claim).uuid
        assert "NVIDIA_VISIBLE_DEVICES" not in reply.envs
        assert reply.envs["PK_PARTITION_UUIDS"] == instance_of(claim).uuid


async def test_two_dcu_partitions_for_one_container_are_refused_unclaimed(nc, js, node) -> None:
    async with node_stack(nc, node, cards=("DCU-64GB",), options=FAST, pod_resources=False) as n:
        await n.watcher.add(n.watcher.record(B, "b", {"main": {R2G: 2}}))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await n.allocate(R2G, ["2g.15gb-0", "2g.15gb-1"])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "exactly one hygon partition" in refused.value.details()
        assert await n.claims() == [] and await n.instances() == []


def _sliced_ppu_node(
    library: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Rig, Driver]:
    rig = thead_rig(library, tmp, monkeypatch, [True, False])  # PPU 1 is sliced
    return rig, open_hgml(rig)


def _sliced_dcu_node(
    library: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Rig, Driver]:
    rig = hygon_rig(library, tmp, monkeypatch, 2, mig=False)  # the node-wide mode off
    return rig, open_dmi(rig)


# (library fixture, node, its sliced resource, slices asked for, the nodes and mounts the container
# gets): one slice per card, so two slices on the DCU node are both its cards.
SLICED_NODES = {
    "T-Head": ("hgml_library", _sliced_ppu_node, "alibabacloud.com/ppu.sliced", 1,
               ["/dev/alixpu", "/dev/alixpu_ctl", "/dev/alixpu_ppu1"], []),
    "Hygon": ("dmi_library", _sliced_dcu_node, "hygon.com/dcu.sliced", 2,
              ["/dev/kfd", "/dev/mkfd", "/dev/dri/card1", "/dev/dri/renderD128", "/dev/dri/card2",
               "/dev/dri/renderD129"], ["/opt/hyhal"]),
}


@pytest.mark.parametrize("vendor", list(SLICED_NODES))
async def test_a_sliced_card_reaches_the_container_through_its_vendor_s_nodes(
    nc, js, node, vendor: str, request: pytest.FixtureRequest, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixture, build, resource, count, devices, mounts = SLICED_NODES[vendor]
    rig, driver = build(request.getfixturevalue(fixture), tmp_path, monkeypatch)
    rig.require_nodes()
    async with node_stack(nc, node, driver=driver, slices_per_card=1) as n:
        uid = await n.add_pod("a", {"main": {resource: count}})
        await n.phase(uid, "Running")
        reply = pod_record(n.kubelet, uid).containers["main"].responses[resource]
        assert [d.container_path for d in reply.devices] == devices
        assert all(d.host_path == str(rig.root) + d.container_path for d in reply.devices)
        assert "NVIDIA_VISIBLE_DEVICES" not in reply.envs
        assert len(reply.envs["PK_SLICE_INDEXES"].split(",")) == count
        assert [m.container_path for m in reply.mounts] == [
            *mounts, "/var/run/partkeeper/sliced/limits.json", "/var/run/partkeeper/sliced/cache"]


async def test_a_sliced_ppu_whose_node_is_missing_is_refused_with_a_sentence(
    nc, js, node, hgml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig, driver = _sliced_ppu_node(hgml_library, tmp_path, monkeypatch)
    rig.require_nodes()
    os.unlink(rig.root / "dev/alixpu_ppu1")
    async with node_stack(nc, node, driver=driver, slices_per_card=1) as n:
        uid = await n.add_pod("a", {"main": {n.config.sliced_resource: 1}})
        await n.phase(uid, "Failed")
        [claim] = await n.claims_of(uid)
        assert f"the slice(s) of claim(s) {claim.id} of Pod default/a ({uid}) are set up but " \
               "allocate failed on card 1: device node /dev/alixpu_ppu1 is missing; kubelet " \
               "may retry" in n.report(uid)
