"""One allocator on its own over the sim driver, with a stand-in watcher answering pods.pending
from a list the caller fills: what the Allocate round-trip test and bench.allocate_latency share."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client
from nats.micro.service import Service

from partkeeper.bus import serve
from partkeeper.bus.rpc import Endpoint
from partkeeper.config import Config
from schemas import PendingPodsQuery, PendingPodsReply, PodRecord
from schemas.names import SERVICE_WATCHER, pods_pending_subject


def lone_config(directory: Path, node: str) -> Config:
    """The allocator's config under `directory` (sim state `sim.json`, no pod-resources socket)."""
    return Config(node=node, kubelet_dir=directory / "dp", pods_dir=directory / "pods",
                  pod_resources_socket=directory / "absent.sock", driver="sim",
                  sim_state=directory / "sim.json")


async def pending_watcher(nc: Client, node: str, pending: list[PodRecord]) -> Service:
    """A watcher that answers pods.pending with whatever `pending` holds when asked."""

    async def answer(query: PendingPodsQuery) -> PendingPodsReply:
        return PendingPodsReply(pods=list(pending))

    return await serve(nc, name=SERVICE_WATCHER, version="0.0.0", description="stand-in",
                       endpoints=[Endpoint("pods-pending", pods_pending_subject(node),
                                           PendingPodsQuery, answer)])
