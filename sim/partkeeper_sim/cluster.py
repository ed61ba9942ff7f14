"""`partkeeper sim cluster`: the whole simulated cluster of one node in one process.

It initialises the simulated cards (W/sim.json, kept when it exists), serves the simulated
Kubernetes API server, writes W/kubeconfig for it, and runs the simulated kubelet of one node
against it (K/device-plugins/kubelet.sock, K/pod-resources/kubelet.sock), until SIGTERM or
SIGINT. `partkeeper up` and `compose/` run it; the services only see the files it writes.

Once everything serves it prints one JSON line on stdout describing where things are (and writes
the same line to `--notify-fd` when given, then closes it: a readiness notification a supervisor
can wait on without polling). This module imports only the standard library at the top, because
the `partkeeper` parser registers the subcommand on every invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partkeeper import heap

log = logging.getLogger("partkeeper_sim.cluster")

DEFAULT_NODE = "sim-node-0"
DEFAULT_CARDS = "H100-80GB,H100-80GB"
DEFAULT_SLICED = "A100-40GB"
# sun_path holds 108 bytes; the longest socket the allocator serves in the plugin dir is its
# per-resource socket, e.g. `partkeeper-nvidia.com_mig-7g.141gb.sock`, with room for prefixes.
_SUN_PATH_MAX = 107
_LONGEST_PLUGIN_SOCKET = 48


class ClusterError(Exception):
    """The simulated cluster cannot start; the message says what and where."""


class Below:
    """A read-only path attribute below one of its owner's base paths: on a class,
    `kubeconfig = Below("workdir", "kubeconfig")` makes `x.kubeconfig` `x.workdir / "kubeconfig"`.
    A directory layout then reads as the table it is."""

    def __init__(self, base: str, *parts: str) -> None:
        self.base = base
        self.parts = parts

    def __get__(self, owner: Any, kind: type | None = None) -> Path:
        return Path(getattr(owner, self.base), *self.parts)


@dataclass(frozen=True, slots=True)
class ClusterPaths:
    """Where the simulated cluster puts what the services read (compose relies on these)."""

    workdir: Path
    kubelet_root: Path

    sim_state = Below("workdir", "sim.json")
    kubeconfig = Below("workdir", "kubeconfig")
    device_plugin_dir = Below("kubelet_root", "device-plugins")
    pod_resources_socket = Below("kubelet_root", "pod-resources", "kubelet.sock")

    def check(self) -> None:
        """Refuse paths too long for a unix socket now, rather than fail later in a service."""
        longest = len(str(self.device_plugin_dir.absolute())) + 1 + _LONGEST_PLUGIN_SOCKET
        if longest > _SUN_PATH_MAX or len(str(self.pod_resources_socket)) > _SUN_PATH_MAX:
            raise ClusterError(
                f"the kubelet dir {self.kubelet_root} is too long for unix sockets "
                f"(at most {_SUN_PATH_MAX - _LONGEST_PLUGIN_SOCKET - len('/device-plugins/')} "
                "characters); choose a shorter path"
            )


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    paths: ClusterPaths
    cards: tuple[str, ...]
    sliced: tuple[str, ...]
    node: str = DEFAULT_NODE
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None
    termination_delay: float = 0.0
    mode: str = "deviceplugin"  # or "dra": the scheduler and the kubelet's DRA side (dra_cluster)


def register(ops: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `cluster` to the `partkeeper sim` subcommands."""
    text = "run the simulated API server, kubelet and cards of one node in this process"
    parser = ops.add_parser("cluster", help=text, description=text)
    parser.add_argument("--workdir", type=Path, required=True,
                        help="holds sim.json (the cards) and kubeconfig")
    parser.add_argument("--kubelet-dir", type=Path, required=True,
                        help="kubelet root: holds device-plugins/ and pod-resources/")
    parser.add_argument("--cards", default=DEFAULT_CARDS, help="card models in partition mode")
    parser.add_argument("--sliced", default=DEFAULT_SLICED, help="card models not in partition "
                        "mode ('' for none)")
    parser.add_argument("--node", default=DEFAULT_NODE, help="the node the kubelet runs")
    parser.add_argument("--host", default="127.0.0.1",
                        help="API server listen address (0.0.0.0 to serve other hosts)")
    parser.add_argument("--port", type=int, default=0, help="API server port (0: a free one)")
    parser.add_argument("--advertise", metavar="HOST",
                        help="host name the kubeconfig names (default: the listen address, or "
                        "this host's address when listening on all)")
    parser.add_argument("--termination-delay", type=float, default=0.0, metavar="SECONDS",
                        help="how long a deleted Pod's containers take to stop")
    parser.add_argument("--mode", choices=("deviceplugin", "dra", "both"),
                        default="deviceplugin",
                        help="dra: a DRA scheduler and kubelet instead of device plugins; both: "
                        "the two side by side, for a node moving between the modes")
    parser.add_argument("--notify-fd", type=int, metavar="FD",
                        help="write the readiness line to this inherited fd, then close it")
    parser.set_defaults(func=main)


def options_from(args: argparse.Namespace) -> ClusterOptions:
    return ClusterOptions(
        paths=ClusterPaths(Path(args.workdir), Path(args.kubelet_dir)),
        cards=_names(args.cards),
        sliced=_names(args.sliced),
        node=args.node,
        host=args.host,
        port=args.port,
        advertise=args.advertise,
        termination_delay=args.termination_delay,
        mode=args.mode,
    )


def _names(raw: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def ensure_state(path: Path, cards: tuple[str, ...], sliced: tuple[str, ...]) -> bool:
    """Create the simulated cards unless the state exists; True when created.

    An existing state is kept as it is (its instances are the "hardware" after a restart); the
    requested models are then only informative.
    """
    from partkeeper_sim.driver import init_state

    try:
        init_state(path, list(cards), list(sliced))
    except FileExistsError:
        return False
    return True


def advertised_url(host: str, port: int, advertise: str | None) -> str:
    """The URL the kubeconfig names: a wildcard listen address is not one a client can dial."""
    name = advertise or host
    if not advertise and _is_wildcard(host):
        name = _own_address()
    if ":" in name:
        name = f"[{name}]"
    return f"http://{name}:{port}"


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _own_address() -> str:
    """This host's address as peers see it (in a container: its address on the network)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Notifier:
    """The readiness line: on stdout, and once on an inherited fd that is then closed."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def ready(self, description: dict[str, Any]) -> None:
        # The real kubelet and API server are Go programs, whose collector runs beside them; this
        # process's own full collections (150 ms measured) would stall the cluster's side of
        # every path the benchmarks time, so its start is exempted as a service's is.
        heap.freeze_startup()
        line = json.dumps(description) + "\n"
        print(line, end="", flush=True)
        if self._fd is not None:
            with contextlib.suppress(OSError):  # the supervisor may have gone; nothing to tell
                os.write(self._fd, line.encode())
        self.close()

    def close(self) -> None:
        """Closing without a line tells the supervisor this process will not become ready."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


async def serve(options: ClusterOptions, stop: asyncio.Event, notifier: Notifier) -> None:
    """Run the cluster until `stop` is set; `notifier` hears once everything serves."""
    from partkeeper_sim.apiserver import ApiServer, write_kubeconfig
    from partkeeper_sim.kubelet.cluster import ClusterPodSource
    from partkeeper_sim.kubelet.kubelet import SimKubelet
    from partkeeper_sim.kubelet.node import node_status

    paths = options.paths
    created = await asyncio.to_thread(ensure_state, paths.sim_state, options.cards, options.sliced)
    log.info("%s simulated cards in %s", "created" if created else "kept", paths.sim_state)
    server = ApiServer(options.host, options.port)
    await server.start()
    try:
        url = advertised_url(options.host, server.port, options.advertise)
        await asyncio.to_thread(write_kubeconfig, paths.kubeconfig, url)
        if options.mode in ("dra", "both"):
            await _serve_dra(options, url, stop, notifier)
            return
        source = ClusterPodSource.from_kubeconfig(options.node, str(paths.kubeconfig))
        kubelet = SimKubelet(
            paths.device_plugin_dir,
            source,
            pod_resources_socket=paths.pod_resources_socket,
            termination_delay=options.termination_delay,
        )
        async with kubelet, node_status(options.node, paths.kubeconfig, kubelet):
            notifier.ready(_describe(options, url, kubelet.kubelet_socket))
            await stop.wait()
            log.info("simulated cluster stopping")
    finally:
        await server.stop()


async def _serve_dra(options: ClusterOptions, url: str, stop: asyncio.Event,
                     notifier: Notifier) -> None:
    from partkeeper_sim import dra_cluster

    paths = options.paths
    both = options.mode == "both"
    ready = asyncio.Event()
    running = asyncio.create_task(dra_cluster.run(
        options.node, paths.kubeconfig, paths.kubelet_root, stop,
        termination_delay=options.termination_delay, device_plugins=both, ready=ready),
        name="sim dra cluster")
    waiting = asyncio.ensure_future(ready.wait())
    await asyncio.wait({running, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if running.done():
        await running  # it failed before serving: its error is the cluster's
        return
    socket = (paths.device_plugin_dir / "kubelet.sock" if both
              else dra_cluster.registry_dir(paths.kubelet_root))
    description = _describe(options, url, socket)
    notifier.ready({**description, "mode": options.mode})
    await running


def _describe(options: ClusterOptions, url: str, kubelet_socket: Path) -> dict[str, Any]:
    paths = options.paths
    return {
        "ready": True,
        "node": options.node,
        "api": url,
        "kubeconfig": str(paths.kubeconfig),
        "sim_state": str(paths.sim_state),
        "kubelet_socket": str(kubelet_socket),
        "device_plugin_dir": str(paths.device_plugin_dir),
        "pod_resources_socket": str(paths.pod_resources_socket),
        "pid": os.getpid(),
    }


async def _main(options: ClusterOptions, notifier: Notifier) -> None:
    from partkeeper.lifecycle import stop_on_signals

    await serve(options, stop_on_signals(), notifier)


def main(args: argparse.Namespace) -> int:
    from partkeeper.telemetry import logs, tracing

    logs.setup("sim-cluster")
    # The kubelet's admissions are spans too, exported as the services' are (OTEL_* variables).
    tracing.setup("sim-cluster")
    options = options_from(args)
    notifier = Notifier(args.notify_fd)
    try:
        options.paths.check()
        options.paths.workdir.mkdir(parents=True, exist_ok=True)
        asyncio.run(_main(options, notifier))
    except (ClusterError, ValueError, OSError) as exc:  # ValueError: an unknown card model
        print(f"partkeeper sim cluster: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        notifier.close()
        tracing.shutdown()
    return 0
