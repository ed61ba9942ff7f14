"""A MIG partition handed to a container end to end: the real allocator over the nvml driver and
the C fake NVML, admitted by the simulated kubelet, whose container runtime checks every device
spec's host path (sim/partkeeper_sim/kubelet/runtime.py), as containerd does.

The kernel driver publishes capability files but makes no node, so a reply that only names the
capability nodes fails the container; the allocator makes them first (partkeeper/devices.py)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.hostfs import char_device
from fakes.nvml import FakeNvml

from partkeeper.devices import NVIDIA_MAJOR, MakeNode
from partkeeper.drivers.nvidia.binding import NvmlDriver
from partkeeper_sim.kubelet import CREATE_CONTAINER_ERROR, UNEXPECTED_ADMISSION_ERROR
from tests_support.allocator import node_stack

RESOURCE = "nvidia.com/mig-1g.10gb"  # the H100, card 0


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Path]:
    """The driver root: the card and control nodes the NVIDIA driver makes, as character devices
    (the runtime takes nothing else). Skips where this process may not make nodes."""
    root = tmp_path / "host"
    nodes = {"nvidiactl": 255, "nvidia0": 0}
    if not all(char_device(root / "dev" / name, NVIDIA_MAJOR, minor)
               for name, minor in nodes.items()):
        pytest.skip("no CAP_MKNOD here: the runtime's check needs real device nodes")
    yield root


def _driver(fake: FakeNvml, root: Path, proc: Path, make_node: MakeNode = os.mknod) -> NvmlDriver:
    assert fake.state.exists()
    return NvmlDriver(root=root, proc_root=proc, make_node=make_node)


async def test_the_container_starts_with_the_capability_nodes_made(
    nc, js, node: str, fake_nvml: FakeNvml, host: Path, tmp_path: Path
) -> None:
    driver = _driver(fake_nvml, host, tmp_path / "proc")
    async with node_stack(nc, node, driver=driver) as n:
        uid = await n.add_pod("a", {"main": {RESOURCE: 1}})
        await n.phase(uid, "Running")
        record = n.kubelet.record(uid)
        assert record is not None
        response = record.containers["main"].responses[RESOURCE]
        caps = [d for d in response.devices if "nvidia-caps" in d.container_path]
        assert len(caps) == 2 and all(stat.S_ISCHR(os.stat(d.host_path).st_mode) for d in caps)
        assert all(d.host_path.startswith(str(host)) for d in response.devices)


async def test_a_maker_that_leaves_no_device_node_refuses_the_allocate(
    nc, js, node: str, fake_nvml: FakeNvml, host: Path, tmp_path: Path
) -> None:
    """A maker that leaves a plain file where the node belongs (as a bind-mount target would):
    the allocator checks what it made (fstat through an O_NOFOLLOW descriptor) and refuses the
    Allocate naming the path, so the reply never names a path that is no device node and the Pod
    fails at admission, before the runtime would fail its container (CreateContainerError)."""
    def plain_file(path: str, mode: int, device: int) -> None:
        Path(path).touch()

    driver = _driver(fake_nvml, host, tmp_path / "proc", make_node=plain_file)
    async with node_stack(nc, node, driver=driver) as n:
        uid = await n.add_pod("a", {"main": {RESOURCE: 1}})
        await n.phase(uid, "Failed")
        message = n.report(uid)
        assert UNEXPECTED_ADMISSION_ERROR in message
        assert "/dev/nvidia-caps/nvidia-cap" in message
        assert "not the device node" in message
        report = n.source.last_report(uid)
        assert report is None or report.reason != CREATE_CONTAINER_ERROR


async def test_a_node_that_cannot_be_made_refuses_the_allocate(
    nc, js, node: str, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """Without CAP_MKNOD (the seam stands in for the kernel's EPERM, so this runs anywhere) the
    Allocate is refused naming the node and why; kubelet fails the Pod at admission, before any
    container the runtime would fail later."""
    def refused(path: str, mode: int, device: int) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)

    driver = _driver(fake_nvml, tmp_path / "host", tmp_path / "proc", make_node=refused)
    async with node_stack(nc, node, driver=driver) as n:
        uid = await n.add_pod("a", {"main": {RESOURCE: 1}})
        await n.phase(uid, "Failed")
        message = n.report(uid)
        assert UNEXPECTED_ADMISSION_ERROR in message
        assert "cannot create /dev/nvidia-caps/nvidia-cap" in message
        assert "Operation not permitted; the allocator needs CAP_MKNOD" in message
