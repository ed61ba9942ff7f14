"""The `partkeeper` command: run a service, provisioning, status and the read-only probe of the
node's driver; with partkeeper-sim installed also the embedded stack (`up`) and the simulated
driver's control (`sim`), which that distribution adds through the `partkeeper.commands` entry
point group (docs/architecture.md, "Two distributions")."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from partkeeper import __version__
from partkeeper.drivers import SIMULATOR

SERVICES = ("watcher", "allocator", "reclaimer", "gc")
# The subcommands partkeeper-sim adds, which say what to install (SIMULATOR) when it is not.
SIM_COMMANDS = {
    "up": "embedded NATS, simulated cluster and cards, the four services",
    "sim": "control the simulated cards and partitions",
}


def _run_service(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"services.{args.service}.main")
    return int(module.main() or 0)


def _status(args: argparse.Namespace) -> int:
    from partkeeper import status

    return status.main(args)


def _provision(args: argparse.Namespace) -> int:
    """Create or update the contract's streams and buckets (the one identity that may)."""
    import asyncio

    from partkeeper.bus.topology import ProvisionError, provision
    from partkeeper.config import ConfigError, load
    from partkeeper.telemetry import logs

    logs.setup("provision")
    try:
        config = load()
    except ConfigError as exc:
        print(f"partkeeper provision: {exc}", file=sys.stderr)
        return 2

    async def run() -> list[str]:
        return await provision(config, deadline=asyncio.get_running_loop().time() + args.timeout)

    try:
        made = asyncio.run(run())
    except ProvisionError as exc:
        print(f"partkeeper provision: {exc}", file=sys.stderr)
        return 1
    print(f"partkeeper provision: {', '.join(made)} ready with {config.stream_replicas} "
          f"replica(s) on {','.join(config.nats_urls)}")
    return 0


def _absent(args: argparse.Namespace) -> int:
    print(f"partkeeper {args.command}: needs the simulator: {SIMULATOR}", file=sys.stderr)
    return 2


def _add_plugins(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The subcommands other distributions register; each of SIM_COMMANDS that none does is a
    stand-in taking any arguments and saying what to install."""
    added = set()
    for entry in entry_points(group="partkeeper.commands"):
        try:
            register = entry.load()
        except ModuleNotFoundError:  # its metadata is here but its modules are not
            continue
        register(sub)
        added.add(entry.name)
    for name, text in SIM_COMMANDS.items():
        if name not in added:
            # No option of its own ("\0" prefixes none), so `up --demo` reaches _absent too.
            absent = sub.add_parser(name, help=f"{text} (needs partkeeper-sim)", add_help=False,
                                    prefix_chars="\0")
            absent.add_argument("arguments", nargs="*")
            absent.set_defaults(func=_absent)


def build_parser() -> argparse.ArgumentParser:
    from partkeeper.drivers import probe

    parser = argparse.ArgumentParser(
        prog="partkeeper",
        description="Accelerator partitions for Kubernetes Pods, allocated and reclaimed safely.",
    )
    parser.add_argument("--version", action="version", version=f"partkeeper {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one service in the foreground")
    run.add_argument("service", choices=SERVICES)
    run.set_defaults(func=_run_service)

    provision = sub.add_parser(
        "provision", help="create or update the streams and buckets (NATS_* variables)")
    provision.add_argument("--timeout", type=float, default=120.0,
                           help="seconds to keep trying while NATS or JetStream is not ready")
    provision.set_defaults(func=_provision)

    status = sub.add_parser("status", help="cards, partitions, claims and capacity, read from NATS")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)

    probe.register(sub)
    _add_plugins(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:  # partkeeper-sim installed without one of its dependencies
        if args.command not in SIM_COMMANDS:
            raise
        print(f"partkeeper {args.command}: the simulator needs {exc.name}, which is not "
              f"installed: {SIMULATOR}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
