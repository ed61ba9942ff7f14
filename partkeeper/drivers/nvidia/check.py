"""`partkeeper probe --check [--mutate]`: what the first run on a MIG-enabled GPU has to show.

Read-only unless `--mutate`: NVML's versions; each card's profiles and placements beside the
built-in tables (probe's view); for every partition, its two capability files and the device
nodes a reply would name (container path, host path, major:minor) with what is at each host path
now. Nothing is created, destroyed or made.

With `--mutate` it also creates one partition (the smallest profile at the first free start of the
first MIG card that agrees with the tables), hands it over as an Allocate would (which makes its
capability nodes), asks a second NVML session opened before the create whether it sees the
partition, destroys it, and asks again. The second session is a child process
(`python -m partkeeper.drivers.nvidia.check --session`), as the allocator and the reclaimer are
separate long-lived processes; a public report says a deleted MIG device can stay visible to a
session opened before the delete. It also says where the create found the new UUID (the CI's own
device handle, or a walk where NVML named the parent card).

bench/gpu_check.sh runs this with the node's own tools beside it; docs/drivers.md ("First run on a
GPU") says what to look for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from partkeeper.devices import node_state
from partkeeper.drivers import profiles
from partkeeper.drivers.base import DriverError, Instance, InstanceSpec
from partkeeper.drivers.nvidia.binding import NvmlDriver
from partkeeper.drivers.probe import profile_lines

SESSION_SECONDS = 60.0


def check(driver: NvmlDriver, *, mutate: bool = False) -> dict[str, Any]:
    """Everything the check shows. Raises DriverError on a failed read (before any change)."""
    cards = []
    for card in driver.cards():
        view = driver.probe_view(card.index)
        parts = [_partition(driver, i) for i in driver.instances(card.index) if i.complete]
        cards.append({"index": card.index, "model": card.model, "mode": card.mode,
                      "problem": card.problem, "mig": view["mig"],
                      "profiles": view["profiles"], "partitions": parts})
    report: dict[str, Any] = {"versions": driver.versions(), "cards": cards, "mutate": None}
    if mutate:
        report["mutate"] = _mutate(driver)
    return report


def _partition(driver: NvmlDriver, inst: Instance) -> dict[str, Any]:
    files = [{"path": str(p), "present": p.exists(),
              "text": p.read_text().strip() if p.exists() else ""}
             for p in driver.capability_files(inst)]
    try:
        nodes = [{"container_path": n.container_path, "host_path": n.host_path,
                  "device": None if n.major is None else f"{n.major}:{n.minor}",
                  "state": node_state(n)} for n in driver.planned_nodes(inst)]
        problem = ""
    except DriverError as exc:
        nodes, problem = [], str(exc)
    return {"uuid": inst.uuid, "profile": inst.profile, "start": inst.start,
            "gi_id": inst.gi_id, "ci_id": inst.ci_id, "capability_files": files,
            "nodes": nodes, "problem": problem}


def _free_spot(driver: NvmlDriver) -> InstanceSpec | None:
    for card in driver.cards():
        if card.mode != "partition" or card.problem or card.model not in profiles.MODELS:
            continue
        taken = [i.placement for i in driver.instances(card.index)]
        smallest = min(profiles.MODELS[card.model].profiles.values(), key=lambda p: p.size)
        for start in smallest.starts:
            if not any(profiles.overlaps((start, smallest.size), t) for t in taken):
                return InstanceSpec(card.index, smallest.name, start)
    return None


def _mutate(driver: NvmlDriver) -> dict[str, Any]:
    spec = _free_spot(driver)
    if spec is None:
        return {"skipped": "no MIG card that agrees with the tables has a free 1-slice spot"}
    result: dict[str, Any] = {"spec": f"card {spec.card} {spec.profile} at {spec.start}"}
    with _Session() as other:
        before = other.uuids(spec.card)
        inst = driver.create(spec)
        result["uuid"], result["uuid_from"] = inst.uuid, driver.uuid_source
        try:
            result["nodes"], result["nodes_problem"] = _handed_over(driver, inst)
            result["second_session_sees_create"] = inst.uuid in other.uuids(spec.card)
        finally:
            driver.destroy(inst)
        after = other.uuids(spec.card)
        result["second_session_sees_destroy"] = inst.uuid not in after
        result["second_session_before"] = before
    return result


def _handed_over(driver: NvmlDriver, inst: Instance) -> tuple[list[dict[str, str]], str]:
    """The nodes an Allocate reply names for `inst`, made as the reply makes them, and what is
    at each; or the refusal the reply would be."""
    try:
        edits = driver.container_edits([inst])
    except DriverError as exc:
        return [], str(exc)
    return [{"host_path": n.host_path, "state": node_state(n)} for n in edits.devices], ""


class _Session:
    """A second NVML session in a child process, opened before the change it is asked about."""

    def __enter__(self) -> _Session:
        self.child = subprocess.Popen(
            [sys.executable, "-m", "partkeeper.drivers.nvidia.check", "--session"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        self._expect("ready")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.child.stdin is not None:
            self.child.stdin.close()
        try:
            self.child.wait(timeout=SESSION_SECONDS)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()

    def _expect(self, what: str) -> str:
        assert self.child.stdout is not None
        line = self.child.stdout.readline().strip()
        if not line.startswith(what):
            raise RuntimeError(f"the second NVML session answered {line!r}, not {what}")
        return line.removeprefix(what).strip()

    def uuids(self, card: int) -> list[str]:
        assert self.child.stdin is not None
        self.child.stdin.write(f"list {card}\n")
        self.child.stdin.flush()
        return list(json.loads(self._expect("uuids")))


def _serve_session() -> int:
    """The child: one NVML session, kept open, listing a card's MIG UUIDs on request."""
    driver = NvmlDriver()
    print("ready", flush=True)
    for line in sys.stdin:
        _, _, card = line.strip().partition(" ")
        found = [i.uuid for i in driver.instances(int(card))]
        print("uuids " + json.dumps(found), flush=True)
    driver.close()
    return 0


def render(report: dict[str, Any]) -> list[str]:
    versions = report["versions"]
    lines = [f"NVML {versions['nvml']}, driver {versions['driver']}"]
    for card in report["cards"]:
        agrees = f"REFUSED: {card['problem']}" if card["problem"] else "agrees with the tables"
        lines.append(f"card {card['index']} {card['model']} ({card['mode']}; {agrees})")
        lines.extend(profile_lines(card["profiles"]))
        for part in card["partitions"]:
            lines.append(f"  partition GI {part['gi_id']} CI {part['ci_id']} {part['profile']} "
                         f"at {part['start']}: {part['uuid']}")
            for f in part["capability_files"]:
                text = f["text"].replace("\n", "; ") if f["present"] else "MISSING"
                lines.append(f"    {f['path']}: {text}")
            for n in part["nodes"]:
                lines.append(f"    reply names {n['container_path']} <- {n['host_path']} "
                             f"(c {n['device']}): {n['state']}")
            if part["problem"]:
                lines.append(f"    no reply possible: {part['problem']}")
    mutate = report["mutate"]
    if mutate is None:
        lines.append("read-only: nothing created (--mutate creates and destroys one partition)")
    elif "skipped" in mutate:
        lines.append(f"--mutate skipped: {mutate['skipped']}")
    else:
        lines.append(f"--mutate: created {mutate['spec']}: {mutate['uuid']} (UUID from the "
                     f"{mutate['uuid_from']})")
        lines.extend(f"  node {n['host_path']}: {n['state']}" for n in mutate["nodes"])
        if mutate["nodes_problem"]:
            lines.append(f"  the reply would be refused: {mutate['nodes_problem']}")
        lines.append(f"  a second NVML session sees the create: "
                     f"{_yes(mutate['second_session_sees_create'])}, and the destroy: "
                     f"{_yes(mutate['second_session_sees_destroy'])}")
    return lines


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


if __name__ == "__main__":
    if sys.argv[1:] == ["--session"]:
        raise SystemExit(_serve_session())
    raise SystemExit("usage: partkeeper probe --check [--mutate]")
