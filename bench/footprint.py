"""Memory and CPU of each service process while `partkeeper up --demo` runs its scenario.

Usage: python -m bench.footprint [--rounds N] [--idle SECONDS]

Samples every service process (`partkeeper run <service>`) of the embedded stack twice a second
from /proc: the peak resident set, and the CPU seconds used over the run. With `--idle`, also
the steady state: `partkeeper up` without a scenario, sampled for that long once it is ready (the
CPU used then, per second, is what a quiet node costs). The DaemonSet's requests and limits
(deploy/base/daemonset.yaml) are set from these figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVICES = ("watcher", "allocator", "reclaimer", "gc")
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _service_of(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    words = [a.decode(errors="replace") for a in argv]
    for i, word in enumerate(words[:-1]):
        if word == "run" and words[i + 1] in SERVICES:
            return words[i + 1]
    return None


def _sample(pid: int) -> tuple[int, float] | None:
    """(resident bytes, CPU seconds) of `pid`, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        statm = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return None
    return int(statm[1]) * PAGE, (int(stat[11]) + int(stat[12])) / TICKS


def measure(rounds: int) -> dict[str, dict[str, float]]:
    peak: dict[str, float] = dict.fromkeys(SERVICES, 0.0)
    cpu: dict[str, float] = dict.fromkeys(SERVICES, 0.0)
    wall = 0.0
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="pk-footprint-") as workdir:
            start = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "partkeeper", "up", "--demo", "--workdir", workdir],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            last: dict[int, tuple[str, float]] = {}
            while proc.poll() is None:
                for pid, (service, rss, seconds) in _all().items():
                    peak[service] = max(peak[service], rss / 2**20)
                    last[pid] = (service, seconds)
                time.sleep(0.5)
            wall += time.monotonic() - start
            for service, seconds in last.values():
                cpu[service] += seconds
            if proc.returncode != 0:
                raise SystemExit(f"the demo failed (exit {proc.returncode})")
    return {s: {"peak_rss_mib": peak[s], "cpu_seconds": cpu[s] / rounds,
                "cpu_millicores": 1000 * cpu[s] / wall} for s in SERVICES}


def idle(seconds: float) -> dict[str, dict[str, float]]:
    """Peak RSS and mean CPU of each service over `seconds` of a ready, quiet stack."""
    with tempfile.TemporaryDirectory(prefix="pk-footprint-") as workdir:
        proc = subprocess.Popen(
            [sys.executable, "-m", "partkeeper", "up", "--workdir", workdir],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.stdout is not None
        for line in proc.stdout:
            if "ready in" in line:
                break
        else:
            raise SystemExit("the stack did not start")
        first = _all()
        peak = dict.fromkeys(SERVICES, 0.0)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _pid, (service, rss, _cpu) in _all().items():
                peak[service] = max(peak[service], rss / 2**20)
            time.sleep(0.5)
        last = _all()
        proc.send_signal(2)
        proc.communicate(timeout=60)
    used = dict.fromkeys(SERVICES, 0.0)
    for pid, (service, _rss, cpu) in last.items():
        used[service] += cpu - first.get(pid, (service, 0, 0.0))[2]
    return {s: {"peak_rss_mib": peak[s], "cpu_millicores": 1000 * used[s] / seconds}
            for s in SERVICES}


def _all() -> dict[int, tuple[str, int, float]]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (service := _service_of(int(entry))) is not None:
            sample = _sample(int(entry))
            if sample is not None:
                found[int(entry)] = (service, sample[0], sample[1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--idle", type=float, default=0.0)
    args = parser.parse_args()
    if args.idle:
        print(f"`partkeeper up`, ready and quiet, sampled for {args.idle:.0f} s:")
        print("| service | peak RSS (MiB) | mean CPU (millicores) |")
        print("|---|---|---|")
        for service, f in idle(args.idle).items():
            print(f"| {service} | {f['peak_rss_mib']:.1f} | {f['cpu_millicores']:.1f} |")
    figures = measure(args.rounds)
    print(f"`partkeeper up --demo`, {args.rounds} round(s); per service process:")
    print("| service | peak RSS (MiB) | CPU seconds per demo | mean CPU (millicores) |")
    print("|---|---|---|---|")
    for service, f in figures.items():
        print(f"| {service} | {f['peak_rss_mib']:.1f} | {f['cpu_seconds']:.2f} | "
              f"{f['cpu_millicores']:.0f} |")


if __name__ == "__main__":
    main()
