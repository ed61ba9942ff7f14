"""`python -m bench` (also `make bench`): every benchmark, then docs/benchmarks.md.

A benchmark whose module offers a function returning its figures runs in this process; the
others run as `python -m bench.<name>` subprocesses and their printed lines go into the report
verbatim (nothing here parses them). Each subprocess gets its own process group, which is killed
once it ends or times out, so a nats-server it started cannot outlive it. Exit status 1 when a
benchmark failed to run; figures that miss a goal are reported, not failed.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import machine
from bench.report import Outcome, render

ROOT = Path(__file__).resolve().parent.parent
SUBPROCESS_SECONDS = 900.0
IMPORT_SECONDS = 60.0
RECLAIM_CYCLES = 200


@dataclass(frozen=True, slots=True)
class External:
    """A benchmark run as `python -m <module> <args>`, its stdout kept verbatim."""

    name: str
    module: str
    args: tuple[str, ...]
    optional: bool = False  # absent or not importable: skipped, not failed

    @property
    def command(self) -> str:
        return " ".join(["python", "-m", self.module, *self.args])


@dataclass(frozen=True, slots=True)
class Internal:
    """A benchmark whose module returns its figures (a dict with `lines` and `command`)."""

    name: str
    module: str
    command: str
    measure: Callable[[], dict[str, Any]]


Benchmark = External | Internal

BENCHMARKS: tuple[Benchmark, ...] = (
    External("allocate latency", "bench.allocate_latency", ("--calls", "500"), optional=True),
    External("GC sweep", "bench.gc_sweep", ("--pods", "10000", "--live", "9000")),
    External("service footprint", "bench.footprint", ("--rounds", "2", "--idle", "60")),
    External("list-watch readers", "bench.list_watch", ("--pods", "2000", "--rounds", "3")),
    External("chaos", "bench.chaos", ("--steps", "300", "--seed", "7")),
    External("profile mix", "bench.profile_mix", ("--waits", "2,10,30", "--samples", "4")),
    External("fleet", "bench.fleet", ("--nodes", "50,200,500,1000", "--layout", "r1")),
    # Imported when run: a module that does not import fails its own line, not the others.
    Internal("reclaim latency", "bench.reclaim_latency",
             f"python -m bench.reclaim_latency --cycles {RECLAIM_CYCLES}",
             lambda: importlib.import_module("bench.reclaim_latency").measure(
                 cycles=RECLAIM_CYCLES)),
    External("DRA latency", "bench.dra_latency", ("--cycles", "100")),
    External("NVML calls", "bench.nvml_calls", ("--rounds", "200", "--busy", "6")),
    External("fuzzing at volume", "bench.fuzz", ("--inputs", "100000")),
    # Needs podman and the base image of tests/containers/setup.sh; says so and measures nothing
    # without them.
    External("image", "bench.image", ("--runs", "5")),
    External("allocate path", "bench.allocate_path", ()),
)


def about(module: str) -> str:
    """The module docstring without its usage line, read from the source, not imported."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return ""
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) or ""
    return "\n".join(doc.splitlines()[1:]).strip()


def clean(text: str) -> str:
    """The report names no path of this machine: the checkout's location is elided."""
    return text.replace(str(ROOT), ".")


def run_external(b: External) -> Outcome:
    started = time.monotonic()
    outcome = Outcome(b.name, b.command, "", "ran", 0.0)
    if importlib.util.find_spec(b.module) is None:
        outcome.status = f"skipped: {b.module} is not there"
        return outcome
    outcome.about = about(b.module)
    code, _, err = _python(["-c", f"import {b.module}"], IMPORT_SECONDS)
    if code != 0:
        outcome.status = f"{'skipped' if b.optional else 'failed'}: {b.module} does not " \
                         f"import: {_last_line(err)}"
        return outcome
    code, out, err = _python(["-m", b.module, *b.args], SUBPROCESS_SECONDS)
    outcome.lines = out.splitlines()
    if code != 0:
        outcome.status = f"failed: exit status {code}: {_last_line(err)}"
    outcome.seconds = time.monotonic() - started
    return outcome


def run_internal(b: Internal) -> Outcome:
    started = time.monotonic()
    try:
        figures = b.measure()
    except Exception as exc:  # one benchmark breaking must not lose the others' figures
        return Outcome(b.name, b.command, about(b.module), f"failed: {type(exc).__name__}: {exc}",
                       time.monotonic() - started)
    status = "ran" if not figures.get("aborted") else f"stopped early: {figures['aborted']}"
    return Outcome(b.name, figures["command"], about(b.module), status,
                   time.monotonic() - started, list(figures["lines"]), figures)


def _python(args: Sequence[str], timeout: float) -> tuple[int, str, str]:
    """Run this interpreter from the repository root; returns (status, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        return -1, out, f"{err}\ntimed out after {timeout:.0f}s"
    finally:
        _kill_group(proc.pid)  # whatever it left behind in its group
    return proc.returncode, out, err


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return clean(lines[-1].strip()) if lines else "(no output)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md",
                        help="where to write the report (default docs/benchmarks.md)")
    args = parser.parse_args(argv)
    facts = machine.describe(ROOT)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    outcomes: list[Outcome] = []
    for b in BENCHMARKS:
        print(f"bench: {b.name} ...", flush=True)
        outcome = run_external(b) if isinstance(b, External) else run_internal(b)
        outcome.lines = [clean(line) for line in outcome.lines]
        outcome.status = clean(outcome.status)
        print("\n".join([f"bench: {b.name}: {outcome.status}", *outcome.lines]), flush=True)
        outcomes.append(outcome)
    args.output.write_text(render(outcomes, facts, when))
    print(f"bench: wrote {args.output}", flush=True)
    return 1 if any(o.status.startswith("failed") or o.status.startswith("stopped")
                    for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
