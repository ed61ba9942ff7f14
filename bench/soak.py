"""Soak: `python -m bench.soak --minutes N [--seed S] [--slots K] [--json]`.

The embedded stack (nats-server, simulated cluster, the four services as processes) with Pods
churning for N minutes while faults are injected at random: `kill -9` of a random service (then
started again), the nats-server restarted in place, a partition held busy while its Pod is
deleted (released a moment later). Then the churn stops, every Pod is deleted, and the node must
converge (tests_support.converge). Reported: Pods created, admitted, refused; faults injected;
leaks (instances without a live owner); destroys under live Pods (the sentinel: an active claim
of a live Pod whose instance vanished, or whose claim was released); lost events (a deleted Pod
whose claim is never released); peak RSS per service. Exit status 0 only with none of the three.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper_sim.stack.launch import SERVICES
from schemas.names import BUCKET_CLAIMS
from tests_support.churn import Churn, Sentinel, Workload
from tests_support.converge import NotConverged, Reader, converged, problems
from tests_support.rig import Rig, open_rig, reconnected

PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", None)
FAULT_GAP = (4.0, 12.0)  # seconds between faults
BUSY_HOLD = (0.5, 3.0)
CONVERGE_SECONDS = 150.0  # the reclaimer's 60 s create timeout, and room for a slow machine
RSS_EVERY = 1.0


@dataclass
class Report:
    minutes: float
    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    rss_peak_mib: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    tally: dict[str, int] = field(default_factory=dict)
    refusal_reasons: Counter[str] = field(default_factory=Counter)
    converge_seconds: float = 0.0

    @property
    def leaks(self) -> list[str]:
        return [p for p in self.problems if p.startswith("instance")]

    @property
    def lost(self) -> list[str]:
        return [p for p in self.problems if p.startswith("claim")]

    @property
    def passed(self) -> bool:
        return not self.problems and not self.violations


async def inject(rig: Rig, work: Workload, rng: random.Random, report: Report) -> None:
    """One fault, chosen at random."""
    kind = rng.choice(("kill", "kill", "nats", "busy"))
    if kind == "kill":
        name = rng.choice(SERVICES)
        await rig.kill(name)
        await rig.restart(name)
        report.faults[f"kill -9 {name}"] += 1
    elif kind == "nats":
        await rig.restart_nats()
        await asyncio.wait_for(reconnected(rig), 30.0)
        report.faults["nats restart"] += 1
    else:
        live = [p for p in work.live() if p.kind == "partition" and p.instance]
        if not live:
            return
        pod = rng.choice(live)
        await work.probe.set_busy(pod.instance, True)
        await work.delete(pod)
        await asyncio.sleep(rng.uniform(*BUSY_HOLD))  # how long the process holds it
        await work.probe.set_busy(pod.instance, False)
        report.faults["busy instance"] += 1


async def learn_instances(work: Workload) -> None:
    """Remember each running Pod's MIG UUID (from its claim), for the busy faults."""
    claims = await work.probe.claims()
    by_uid = {c.pod_uid: c for c in claims if c.instance is not None}
    for pod in work.live():
        claim = by_uid.get(pod.uid)
        if claim is not None and claim.instance is not None:
            pod.instance = claim.instance.uuid


async def faults(rig: Rig, work: Workload, rng: random.Random, report: Report) -> None:
    while True:
        await asyncio.sleep(rng.uniform(*FAULT_GAP))  # the pace of the faults, by design
        try:
            await learn_instances(work)
            await inject(rig, work, rng, report)
        except Exception as exc:  # noted; the convergence check at the end is the verdict
            report.faults[f"fault failed: {type(exc).__name__}"] += 1


def rss_mib(pid: int) -> float | None:
    """Resident set size of a process from /proc (None once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


async def sample_rss(rig: Rig, report: Report) -> None:
    while True:
        for name in SERVICES:
            mib = rss_mib(rig.child(name).pid)
            if mib is not None:  # None: between a kill and its restart
                report.rss_peak_mib[name] = max(report.rss_peak_mib.get(name, 0.0), mib)
        await asyncio.sleep(RSS_EVERY)


async def soak(minutes: float, seed: int, slots: int) -> Report:
    report = Report(minutes, seed)
    rng = random.Random(seed)
    async with open_rig() as rig:
        work = Workload(rig.stack)
        await work.start()
        sentinel = Sentinel(work)
        sentinel.start()
        churn = Churn(work, PROFILES, slots=slots, seed=seed)
        churn.start()
        background = [asyncio.create_task(faults(rig, work, rng, report)),
                      asyncio.create_task(sample_rss(rig, report))]
        try:
            await asyncio.sleep(minutes * 60)  # the soak's length
            background[0].cancel()
            await churn.stop()
            await work.delete_all()
            await settle(rig, work, report)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await sentinel.stop()
            report.violations = list(sentinel.violations.values())
            report.tally = {k: getattr(work.tally, k) for k in
                            ("created", "admitted", "refused", "unscheduled", "deleted")}
            report.refusal_reasons = Counter(r.split(": ", 1)[1].split(":")[0]
                                             for r in work.tally.refusals)
            await work.stop()
    return report


async def settle(rig: Rig, work: Workload, report: Report) -> None:
    store = ClaimsStore(await Bucket.open(rig.stack.nc.jetstream(), BUCKET_CLAIMS), rig.stack.node)
    reader = Reader(work.kube.api, store, rig.layout.cluster.sim_state, rig.layout.pods_dir,
                    rig.stack.node)
    started = time.monotonic()
    try:
        await converged(reader.snapshot, deadline=CONVERGE_SECONDS)
    except NotConverged:
        report.problems = problems(await reader.snapshot())
    report.converge_seconds = time.monotonic() - started


def summary(report: Report) -> list[str]:
    t = report.tally
    faults = ", ".join(f"{n} {k}" for k, n in sorted(report.faults.items())) or "none"
    rss = ", ".join(f"{k} {v:.0f}" for k, v in sorted(report.rss_peak_mib.items()))
    return [
        f"soak: {report.minutes:g} min, seed {report.seed}",
        f"  Pods created {t.get('created', 0)}, admitted {t.get('admitted', 0)}, refused "
        f"{t.get('refused', 0)}, not scheduled in time {t.get('unscheduled', 0)}",
        f"  refusals by reason: {dict(report.refusal_reasons) or 'none'}",
        f"  faults injected ({sum(report.faults.values())}): {faults}",
        f"  converged {report.converge_seconds:.1f}s after the last Pod was deleted",
        f"  leaks: {len(report.leaks)}; destroys under live Pods: {len(report.violations)}; "
        f"lost events: {len(report.lost)}",
        *[f"    {p}" for p in report.problems + report.violations],
        f"  peak RSS (MiB): {rss}",
        f"  result: {'PASS' if report.passed else 'FAIL'}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slots", type=int, default=4, help="Pods churning at once")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = asyncio.run(soak(args.minutes, args.seed, args.slots))
    if args.json:
        body: dict[str, Any] = {**report.__dict__, "passed": report.passed,
                                "leaks": report.leaks, "lost": report.lost}
        print(json.dumps(body, indent=2, default=dict))
    else:
        print("\n".join(summary(report)))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
