"""Card health through the real allocator over the nvml driver and the C fake NVML: the events
NVML's event set delivers (a critical XID, an application XID, a card falling off the bus and
coming back) move the device-plugin tokens kubelet sees, and the per-card metric."""

from __future__ import annotations

from pathlib import Path

from fakes import nvml as nv
from fakes.nvml import FakeNvml
from prometheus_client import REGISTRY

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
