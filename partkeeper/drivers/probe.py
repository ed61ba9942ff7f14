"""`partkeeper probe [--json]`: the node's driver as partkeeper sees it, for operators.

Read-only: it lists cards, MIG mode (current and pending), the profiles with the library's ids and
legal placements (or why there are none), the existing instances with UUIDs and process counts,
and whether each card agrees with the built-in tables. It never creates, destroys or changes a
mode. `--check` (nvml) adds what a first run on a GPU needs to see, still read-only;
`--check --mutate` also creates and destroys one partition (partkeeper/drivers/nvidia/check.py).
When the library cannot be loaded or a read fails it prints one sentence and exits non-zero, never
a traceback.

It lives with the drivers because only the driver modules touch the vendor library.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from partkeeper import limiter
from partkeeper.config import ConfigError, load
from partkeeper.drivers import DriverError, open_driver, profiles
from partkeeper.drivers.base import (
    Card,
    CardLostError,
    Driver,
    Instance,
    LibraryMissing,
    ReadError,
)
from partkeeper.drivers.mig import MigDriver

EXIT_NO_LIBRARY = 2
EXIT_READ_FAILED = 1
EXIT_USAGE = 64


def _tables(model: str) -> dict[str, profiles.Profile]:
    found = profiles.MODELS.get(model)
    return found.profiles if found else {}


def _instances(driver: Driver, card: Card) -> list[dict[str, Any]]:
    found = []
    for inst in driver.instances(card.index):
        processes = _processes(driver, inst) if inst.complete else 0
        found.append({"uuid": inst.uuid, "profile": inst.profile, "start": inst.start,
                      "size": inst.size, "gi_id": inst.gi_id, "ci_id": inst.ci_id,
                      "complete": inst.complete, "processes": processes})
    return found


def _processes(driver: Driver, inst: Instance) -> int | None:
    """The process count; None where the library cannot tell (Hygon: only a destroy says
    IN_USE). The sim only says busy or not."""
    if isinstance(driver, MigDriver):
        return driver.processes("probe", inst.card, inst.gi_id)
    try:
        return int(driver.is_busy(inst))
    except ReadError:
        return None


def _table_profile(p: profiles.Profile) -> dict[str, Any]:
    spots = [list(x) for x in p.placements()]
    return {"name": p.name, "nvml_id": None, "nvml_profile": None,
            "instances": profiles.max_instances(p), "placements": spots,
            "placements_error": None, "table_placements": spots, "matches": True}


def _table_view(card: Card) -> dict[str, Any]:
    partition = card.mode == "partition"
    shapes = _tables(card.model).values() if partition else ()
    return {
        "mig": {"current": partition, "pending": partition},
        "profiles": [_table_profile(p) for p in shapes],
    }


def gather(driver: Driver) -> dict[str, Any]:
    """Everything probe shows, read from `driver`. Raises DriverError on any failed read."""
    cards = []
    for card in driver.cards():
        try:
            cards.append(_card(driver, card))
        except CardLostError as exc:  # lost between the listing and the reads of it
            cards.append(_lost(card, f"lost: {exc.cause}"))
    # Whether the slice limiter's files are there (PK_SLICE_LIMITER, read here as at a start).
    return {"driver": driver.name, "cards": cards, "slice_limiter": limiter.report(load())}


def _card(driver: Driver, card: Card) -> dict[str, Any]:
    if card.problem.startswith("lost:"):
        return _lost(card, card.problem)
    # A vendor library's own view; the sim has none beyond the tables.
    view = driver.probe_view(card.index) if isinstance(driver, MigDriver) else _table_view(card)
    known = card.model in profiles.MODELS
    found = {
        "index": card.index, "uuid": card.uuid, "model": card.model, "mode": card.mode,
        "memory_mib": card.memory_mib, "minor": card.minor, **view,
        "matches_tables": known and not card.problem, "problem": card.problem or (
            "" if known or card.mode == "sliced" else "model not in the built-in tables"),
        "instances": _instances(driver, card),
    }
    # The simulator says what its cards reported (`sim fail --card`); a library has no memory
    # of past XIDs, the services' card watch does (partkeeper status).
    reported = getattr(driver, "card_health", None)
    if callable(reported):
        found["health"], found["xids"] = reported(card.index)
    return found


def _lost(card: Card, problem: str) -> dict[str, Any]:
    """A card that stopped answering: nothing of it can be read until it is reset."""
    return {"index": card.index, "uuid": card.uuid, "model": card.model or "unknown",
            "mode": card.mode, "memory_mib": card.memory_mib, "minor": card.minor,
            "mig": None, "profiles": [], "matches_tables": False, "problem": problem,
            "instances": [], "health": "lost"}


def profile_lines(shown: list[dict[str, Any]]) -> list[str]:
    """One line per profile: the library's id, the instance count and the legal starts."""
    lines = []
    for p in shown:
        starts = ",".join(str(s) for s, _ in p["placements"])
        if p.get("placements_error"):
            starts = f"none (NVML: {p['placements_error']})"
        elif p.get("matches") is False:
            starts += f" (the tables: {','.join(str(s) for s, _ in p['table_placements'])})"
        ident = "" if p["nvml_id"] is None else f" nvml id {p['nvml_id']}"
        lines.append(f"  profile {p['name']}{ident}: {p['instances']} max, starts {starts}")
    return lines


def render(view: dict[str, Any]) -> None:
    print(f"driver {view['driver']}: {len(view['cards'])} card(s)")
    if "slice_limiter" in view:
        print(view["slice_limiter"]["line"])
    for card in view["cards"]:
        mig = card["mig"]
        mode = "no MIG" if mig is None else f"MIG current {'on' if mig['current'] else 'off'}, " \
            f"pending {'on' if mig['pending'] else 'off'}"
        agrees = "matches the tables" if card["matches_tables"] else f"REFUSED: {card['problem']}"
        if card.get("health") == "lost":
            print(f"card {card['index']} LOST: {card['problem'].removeprefix('lost: ')}; it "
                  "answers nothing until it is reset, and takes no partition")
            continue
        print(f"card {card['index']} {card['model']} {card['uuid']} ({mode}; {agrees})")
        if card.get("health") == "failed":
            print(f"  FAILED: fatal XID(s) {', '.join(map(str, card['xids']))} reported; "
                  "it takes no partition until it recovers")
        for line in profile_lines(card["profiles"]):
            print(line)
        for i in card["instances"]:
            uuid = i["uuid"] or "(no compute instance)"
            count = "unknown" if i["processes"] is None else i["processes"]
            print(f"  instance GI {i['gi_id']} {i['profile']} at {i['start']}+{i['size']}: "
                  f"{uuid}, {count} process(es)")


def main(args: argparse.Namespace) -> int:
    if args.mutate and not args.check:
        print("partkeeper probe: --mutate goes with --check", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = load()
        if args.check and config.driver != "nvml":
            print(f"partkeeper probe: --check reads NVML; PK_DRIVER is {config.driver}",
                  file=sys.stderr)
            return EXIT_USAGE
        driver = open_driver(config)
        # --check: the first run on a MIG-enabled GPU (partkeeper/drivers/nvidia/check.py)
        view = _checked(driver, args.mutate) if args.check else gather(driver)
    except LibraryMissing as exc:
        print(f"partkeeper probe: {exc}", file=sys.stderr)
        return EXIT_NO_LIBRARY
    except (ConfigError, DriverError) as exc:
        print(f"partkeeper probe: {exc}", file=sys.stderr)
        return EXIT_READ_FAILED
    if config.mode == "dra":  # what CDI-only hand-off leaves to the container runtime
        from partkeeper.dra import toolkit

        view["container_runtime"] = toolkit.check(config.driver, config.cdi_dir)
    if args.json:
        print(json.dumps(view, indent=2))
    elif args.check:
        from partkeeper.drivers.nvidia import check

        print("\n".join(check.render(view)))
    else:
        render(view)
        if view.get("container_runtime", {}).get("advice"):
            print(f"DRA: {view['container_runtime']['advice']}")
    return 0


def _checked(driver: Driver, mutate: bool) -> dict[str, Any]:
    from partkeeper.drivers.nvidia import check  # here: it needs the nvml driver's module
    from partkeeper.drivers.nvidia.binding import NvmlDriver

    assert isinstance(driver, NvmlDriver)  # PK_DRIVER=nvml, checked by the caller
    return check.check(driver, mutate=mutate)


def register(sub: argparse._SubParsersAction) -> None:
    probe = sub.add_parser("probe", help="read-only view of the node's driver and its cards")
    probe.add_argument("--json", action="store_true", help="machine-readable output")
    probe.add_argument("--check", action="store_true",
                       help="nvml: versions, placements, capability files and the nodes a reply "
                       "would name (read-only)")
    probe.add_argument("--mutate", action="store_true",
                       help="with --check: also create, hand over and destroy one partition, "
                       "watched by a second NVML session")
    probe.set_defaults(func=main)
