"""`python -m partkeeper_sim.kubelet`: the simulated kubelet, until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from partkeeper.kubelet import DEFAULT_DEVICE_PLUGIN_DIR, DEFAULT_POD_RESOURCES_SOCKET
from partkeeper.lifecycle import stop_on_signals
from partkeeper.telemetry import logs
from partkeeper_sim.kubelet.cluster import ClusterPodSource
from partkeeper_sim.kubelet.kubelet import SimKubelet

log = logging.getLogger("partkeeper_sim.kubelet")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(prog="python -m partkeeper_sim.kubelet", description=__doc__)
    parser.add_argument(
        "--kubelet-dir",
        type=Path,
        default=Path(env.get("PK_KUBELET_DIR") or DEFAULT_DEVICE_PLUGIN_DIR),
        help="device-plugin dir where kubelet.sock is served (PK_KUBELET_DIR)",
    )
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=Path(env.get("PK_POD_RESOURCES_SOCKET") or DEFAULT_POD_RESOURCES_SOCKET),
        help="where the pod-resources v1 service listens (PK_POD_RESOURCES_SOCKET)",
    )
    parser.add_argument(
        "--node",
        default=env.get("PK_NODE_NAME") or socket.gethostname(),
        help="the node whose Pods this kubelet runs (PK_NODE_NAME)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=env.get("KUBECONFIG") or None,
        help="API server access (KUBECONFIG); in-cluster config when unset",
    )
    parser.add_argument(
        "--termination-delay",
        type=float,
        default=0.0,
        help="seconds a deleted Pod's containers take to stop",
    )
    return parser


async def run(args: argparse.Namespace) -> None:
    source = ClusterPodSource.from_kubeconfig(args.node, args.kubeconfig)
    kubelet = SimKubelet(
        args.kubelet_dir,
        source,
        pod_resources_socket=args.pod_resources_socket,
        termination_delay=args.termination_delay,
    )
    stop = stop_on_signals()
    async with kubelet:
        log.info("simulated kubelet for node %s serving %s", args.node, kubelet.kubelet_socket)
        await stop.wait()
    log.info("simulated kubelet stopped")


def main(argv: Sequence[str] | None = None) -> int:
    logs.setup("sim-kubelet")
    asyncio.run(run(build_parser().parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
