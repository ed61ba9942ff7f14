"""`partkeeper up [--workdir DIR] [--demo]`: the embedded default (docs/contract.md section 4).

Starts NATS with JetStream, the simulated cluster (two H100-80GB in partition mode, one A100-40GB
of logical slices) and the four services as separate processes (launch.py, processes.py), says
where everything is, and runs until Ctrl-C or SIGTERM; with `--demo` it runs the scenario
(demo.py) and exits 0 only if it passed. Whatever happens, every child is stopped before `up`
returns. The exit status: 0 stopped on request or demo passed; 1 a part failed or the demo
failed; 2 the working directory is unusable; 130 the demo was interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

from rich.console import Console

from partkeeper_sim.cluster import ClusterError
from partkeeper_sim.stack import demo as scenario
from partkeeper_sim.stack.launch import CARDS, SLICED, Stack, launch
from partkeeper_sim.stack.layout import Layout
from partkeeper_sim.stack.processes import StackError, Supervisor, describe_exit
from partkeeper_sim.stack.summary import lines
from partkeeper_sim.stack.table import make_view

DEMO_SECONDS = 110.0  # the whole scenario, on top of each step's own deadlines
EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE, EXIT_INTERRUPTED = 0, 1, 2, 130


def main(args: argparse.Namespace) -> int:
    layout = Layout.choose(args.workdir)
    try:
        layout.create()
    except (ClusterError, OSError) as exc:
        print(f"partkeeper up: cannot use {layout.root}: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    mode = getattr(args, "mode", "deviceplugin")
    if getattr(args, "migrate", False):
        if not args.demo or mode != "deviceplugin":
            print("partkeeper up: --migrate goes with --demo (and no --mode): the node starts in "
                  "device-plugin mode and moves to DRA", file=sys.stderr)
            return EXIT_UNUSABLE
        mode = "both"  # the cluster runs both kubelet sides; the allocator starts as device plugin
    return asyncio.run(_up(layout, bool(args.demo), Console(), mode))


async def _up(layout: Layout, demo: bool, console: Console, mode: str = "deviceplugin") -> int:
    supervisor = Supervisor(layout.pids_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    session = asyncio.create_task(_session(layout, supervisor, demo, console, mode), name="up")
    stopper = asyncio.create_task(stop.wait(), name="up stop")
    try:
        await asyncio.wait({session, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if session.done():
            code = session.result()
        else:
            console.print("partkeeper up: stopping", highlight=False)
            session.cancel()
            await asyncio.gather(session, return_exceptions=True)
            code = EXIT_INTERRUPTED if demo else EXIT_OK
    except (StackError, FileNotFoundError) as exc:
        print(f"partkeeper up: {exc}", file=sys.stderr, flush=True)
        code = EXIT_FAILED
    finally:
        stopper.cancel()
        notes = await supervisor.stop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    for note in notes:
        print(f"partkeeper up: {note}", file=sys.stderr)
    console.print(f"partkeeper up: stopped; logs in {layout.logs_dir}", highlight=False)
    return code


async def _session(layout: Layout, supervisor: Supervisor, demo: bool, console: Console,
                   mode: str = "deviceplugin") -> int:
    started = time.monotonic()
    stack = await launch(layout, supervisor, mode=mode)
    try:
        _print_ready(console, stack, time.monotonic() - started)
        if demo and mode == "both":
            return await _migrate_demo(stack, supervisor, console)
        if demo:
            return await _demo(stack, supervisor, console)
        child = await supervisor.died()
        print(f"partkeeper up: {describe_exit(child)}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    finally:
        await stack.nc.close()


async def _demo(stack: Stack, supervisor: Supervisor, console: Console) -> int:
    if stack.config.mode == "dra":
        from partkeeper_sim.stack import dra_demo

        result = await supervisor.guard(dra_demo.run(stack, console), timeout=DEMO_SECONDS,
                                        what="the DRA demo", log=stack.layout.log("allocator"))
        for line in result.lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return EXIT_OK if result.passed else EXIT_FAILED
    view = make_view(console)
    outcome = await supervisor.guard(scenario.run(stack, view), timeout=DEMO_SECONDS,
                                     what="the demo scenario", log=stack.layout.log("allocator"))
    for line in lines(outcome):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK if outcome.passed else EXIT_FAILED


async def _migrate_demo(stack: Stack, supervisor: Supervisor, console: Console) -> int:
    from partkeeper_sim.stack import migrate

    result = await supervisor.guard(migrate.run(stack, supervisor, console),
                                    timeout=DEMO_SECONDS, what="the migration demo",
                                    log=stack.layout.log("allocator"))
    for line in result.lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK if result.passed else EXIT_FAILED


def _print_ready(console: Console, stack: Stack, seconds: float) -> None:
    layout = stack.layout
    cards = f"{len(CARDS)}x {CARDS[0]} (partitions), {len(SLICED)}x {SLICED[0]} (logical slices)"
    text = [
        f"partkeeper up: ready in {seconds:.1f}s (node {stack.node})",
        f"  NATS        {stack.nats_url} (JetStream store {layout.nats_dir})",
        f"  API server  {stack.api_url} (kubeconfig {stack.kubeconfig})",
        f"  kubelet     {layout.cluster.device_plugin_dir / 'kubelet.sock'}",
        f"  cards       {layout.cluster.sim_state}: {cards}",
        f"  logs        {layout.logs_dir}/<nats|cluster|watcher|allocator|reclaimer|gc>.log",
        f"  processes   {layout.pids_file}",
        "  from another shell:",
        f"    . {layout.env_file}   # sets NATS_URL, NATS_USER/NATS_PASSWORD (pk-admin), "
        "PK_NODE_NAME, KUBECONFIG, PK_SIM_STATE",
        "    partkeeper status",
        f"    partkeeper sim list --state {layout.cluster.sim_state}",
        f"    Pods: any Kubernetes client with KUBECONFIG={stack.kubeconfig}, "
        f"spec.nodeName {stack.node}",
        "  Ctrl-C stops everything.",
    ]
    for line in text:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
