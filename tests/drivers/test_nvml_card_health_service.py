"""Card health through the real allocator over the nvml driver and the C fake NVML: the events
NVML's event set delivers (a critical XID, an application XID, a card falling off the bus and
coming back) move the device-plugin tokens kubelet sees, and the per-card metric."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import nvml as nv
from fakes.hostfs import char_device
from fakes.nvml import FakeNvml
from prometheus_client import REGISTRY

from partkeeper.devices import NVIDIA_MAJOR
from partkeeper.drivers.nvidia.binding import NvmlDriver
from tests_support import until
from tests_support.allocator import node_stack

RESOURCE = "nvidia.com/mig-1g.10gb"  # the H100 (card 0: 7 tokens) and the A100 (card 1: 4)
H100, A100 = 0, 1


def events(card: int, cause: str) -> float:
    return REGISTRY.get_sample_value("partkeeper_card_events_total",
                                     {"card": str(card), "cause": cause}) or 0.0


def failed(card: int, cause: str) -> float:
    return REGISTRY.get_sample_value("partkeeper_card_failed_devices",
                                     {"card": str(card), "cause": cause}) or 0.0


async def test_xids_and_a_lost_card_through_nvml_move_the_tokens(
    nc, js, node: str, no_complaints: FakeNvml, tmp_path: Path
) -> None:
    driver = NvmlDriver(root=tmp_path / "host", proc_root=tmp_path / "proc")
    async with node_stack(nc, node, driver=driver) as n:
        await n.wait_healthy(RESOURCE, 11)
        seen = events(H100, "xid-13")
        no_complaints.raise_event(H100, nv.EVENT_XID, 13)  # an application's error
        await until(lambda: events(H100, "xid-13") > seen, "the application XID was read")
        await n.wait_healthy(RESOURCE, 11)

        no_complaints.set_lost(A100)  # fallen off the bus: the A100's 4 tokens go
        await n.wait_healthy(RESOURCE, 7)
        await until(lambda: failed(A100, "lost") == 1, "the lost card is a metric")
        no_complaints.set_lost(A100, False)  # reset: it answers again and is offered again
        await n.wait_healthy(RESOURCE, 11)
        await until(lambda: failed(A100, "lost") == 0, "the gauge is back to 0")

        no_complaints.raise_event(H100, nv.EVENT_XID, 48)  # uncorrectable memory error
        await n.wait_healthy(RESOURCE, 4)
        await until(lambda: failed(H100, "xid-48") == 1, "the failed card is a metric")
        assert await n.claims() == []


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Path]:
    """The card and control nodes the simulated kubelet's runtime checks (as in
    test_handoff_kubelet.py); skips where this process may not make nodes."""
    root = tmp_path / "host"
    if not all(char_device(root / "dev" / name, NVIDIA_MAJOR, minor)
               for name, minor in {"nvidiactl": 255, "nvidia0": 0}.items()):
        pytest.skip("no CAP_MKNOD here: the runtime's check needs real device nodes")
    yield root


async def test_an_instance_xid_through_nvml_fails_only_that_pods_token(
    nc, js, node: str, no_complaints: FakeNvml, host: Path, tmp_path: Path
) -> None:
    driver = NvmlDriver(root=host, proc_root=tmp_path / "proc")
    async with node_stack(nc, node, driver=driver) as n:
        a = await n.add_pod("a", {"main": {RESOURCE: 1}})
        await n.phase(a, "Running")
        [claim] = await n.claims_of(a)
        assert claim.instance is not None and claim.card == H100
        await n.wait_healthy(RESOURCE, 11)
        no_complaints.raise_event(H100, nv.EVENT_XID, 94, gi=claim.instance.gi_id,
                                  ci=claim.instance.ci_id)
        await n.wait_healthy(RESOURCE, 10)  # a's token only; the card still places
        assert n.devices(RESOURCE)[claim.device_ids[0]] != "Healthy"
        assert failed(H100, "xid-94") == 0  # no card failed
        [still] = await n.claims_of(a)
        assert still.state == "active" and still.instance == claim.instance
        assert claim.instance.uuid in {i.uuid for i in await n.instances(H100)}
