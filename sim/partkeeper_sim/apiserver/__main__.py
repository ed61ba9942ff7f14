"""`python -m partkeeper_sim.apiserver`: run the simulated API server in the foreground.

Prints the URL on stdout once listening (after writing the kubeconfig, so a caller that waits
for the line can use the file at once) and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from partkeeper.lifecycle import stop_on_signals

from .kubeconfig import write_kubeconfig
from .server import ApiServer


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m partkeeper_sim.apiserver", description="Run the simulated API server."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--kubeconfig", help="write a kubeconfig for the server here")
    parser.add_argument("--bookmark-interval", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--history-limit", type=int, default=10_000, metavar="CHANGES")
    parser.add_argument("--feature-gates", default="", metavar="NAME=BOOL,...",
                        help="as kube-apiserver's; only DRAPartitionableDevices (default true) "
                             "is understood")
    return parser.parse_args(argv)


def _partitionable(gates: str) -> bool:
    for entry in filter(None, (g.strip() for g in gates.split(","))):
        name, _, value = entry.partition("=")
        if name == "DRAPartitionableDevices":
            return value.lower() != "false"
    return True


async def _serve(args: argparse.Namespace) -> None:
    server = ApiServer(
        args.host,
        args.port,
        bookmark_interval=args.bookmark_interval,
        history_limit=args.history_limit,
        partitionable_devices=_partitionable(args.feature_gates),
    )
    stopping = stop_on_signals()
    await server.start()
    try:
        if args.kubeconfig:
            write_kubeconfig(args.kubeconfig, server.url)
        print(server.url, flush=True)
        await stopping.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    asyncio.run(_serve(_arguments(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
