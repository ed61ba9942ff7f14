"""`partkeeper sim ...`: the simulated driver's control (docs/contract.md section 6).

Every subcommand takes `--state FILE` (default: PK_SIM_STATE) and `--json`. Bad input exits with
status 2 and one sentence on stderr, and leaves the state file as it was: every change is one
SimDriver transaction, which validates before it writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from partkeeper.drivers.base import DriverError, Instance

if TYPE_CHECKING:
    from partkeeper_sim.driver import SimDriver

EXIT_INVALID = 2  # the request or the state file is wrong; nothing was changed
EXIT_FAILED = 1  # the system refused (e.g. the state directory is not writable)

Handler = Callable[[argparse.Namespace, Path], tuple[Any, str]]


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add `sim` and its subcommands to the `partkeeper` parser; the `sim` subcommands, so that
    the command line can add `sim cluster` (the simulator's, not the driver's)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state", type=Path, help="the state file (default: PK_SIM_STATE or its default)"
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")

    sim = subparsers.add_parser("sim", help="control the simulated cards and partitions")
    ops = sim.add_subparsers(dest="sim_command", required=True, metavar="COMMAND")

    def command(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        parser = ops.add_parser(name, parents=[common], help=help_text, description=help_text)
        parser.set_defaults(func=_runner(handler))
        return parser

    init = command("init", _init, "create the state: partition-mode cards, then sliced ones")
    init.add_argument(
        "--cards", required=True, help="card models in partition mode, e.g. H100-80GB,H100-80GB"
    )
    init.add_argument("--sliced", default="", help="card models not in partition mode")
    init.add_argument("--force", action="store_true", help="replace an existing state file")

    command("list", _list, "cards and their instances")

    carve = command("carve", _carve, "make an instance by hand, outside the agent (foreign)")
    carve.add_argument("--card", type=int, required=True, help="card index")
    carve.add_argument("--profile", required=True, help="profile name, e.g. 1g.10gb")
    carve.add_argument("--start", type=int, help="placement start (default: lowest free)")

    busy = command("busy", _busy, "a process holds (--on) or releases (--off) an instance")
    busy.add_argument("--uuid", required=True, help="the instance's MIG device UUID")
    state = busy.add_mutually_exclusive_group(required=True)
    state.add_argument("--on", dest="on", action="store_true")
    state.add_argument("--off", dest="on", action="store_false")

    fail = command("fail", _fail, "make the next K driver calls of an operation fail (--op), "
                   "or make a card report an XID (--card)")
    what = fail.add_mutually_exclusive_group(required=True)
    what.add_argument("--op", choices=("create", "destroy", "list"))
    what.add_argument("--card", type=int, help="card index: it reports --xid")
    fail.add_argument("--times", type=int, help="with --op: how many calls fail (0 clears)")
    fail.add_argument("--error", default="unknown", choices=("in_use", "unknown", "halfway"),
                      help="halfway (create, destroy): stop between the two steps")
    fail.add_argument("--xid", type=int, help="with --card: the XID (79: the card is lost)")
    fail.add_argument("--instance", help="with --card: the MIG UUID of the partition it names")

    recover = command("recover", _recover, "a failed card was reset and answers again")
    recover.add_argument("--card", type=int, required=True, help="card index")

    command("reboot", _reboot, "the host rebooted: every card loses its partitions (MIG mode, "
            "card UUIDs and health kept); the boot id under PK_PROC_ROOT is the caller's to "
            "change")

    latency = command("latency", _latency, "make every later create or destroy take this long")
    latency.add_argument("--op", required=True, choices=("create", "destroy"))
    latency.add_argument("--ms", type=int, required=True, help="milliseconds (0 turns it off)")
    return ops


def _runner(handler: Handler) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            result, text = handler(args, _state_path(args))
        except FileExistsError as exc:
            return _refuse(f"{exc}; pass --force to replace it", EXIT_INVALID)
        except (DriverError, ValueError) as exc:  # ValueError covers ConfigError, unknown models
            return _refuse(str(exc), EXIT_INVALID)
        except OSError as exc:
            return _refuse(
                f"cannot use {exc.filename or 'the state file'}: {exc.strerror}", EXIT_FAILED
            )
        print(json.dumps(result, indent=2) if args.json else text)
        return 0

    return run


def _refuse(message: str, status: int) -> int:
    sentence = " ".join(message.split())  # one line whatever the cause's text held
    print(sentence if sentence.endswith(".") else f"{sentence}.", file=sys.stderr)
    return status


def _state_path(args: argparse.Namespace) -> Path:
    if args.state is not None:
        return Path(args.state)
    from partkeeper import config

    return config.load().sim_state


def _driver(path: Path) -> SimDriver:
    from partkeeper_sim.driver import SimDriver

    return SimDriver(path)


def _names(raw: str) -> list[str]:
    return [name.strip() for name in raw.split(",") if name.strip()]


def _init(args: argparse.Namespace, path: Path) -> tuple[Any, str]:
    from partkeeper_sim.driver import init_state

    view = init_state(path, _names(args.cards), _names(args.sliced), force=args.force)
    return view, f"initialised {path} with {len(view['cards'])} cards\n{_table(view)}"


def _list(args: argparse.Namespace, path: Path) -> tuple[Any, str]:
    view = _driver(path).list()
    return view, _table(view)


def _carve(args: argparse.Namespace, path: Path) -> tuple[Any, str]:
    inst = _driver(path).carve(args.card, args.profile, args.start)
    return _instance(inst), f"carved {_describe(inst)}"


def _busy(args: argparse.Namespace, path: Path) -> tuple[Any, str]:
    inst = _driver(path).set_busy(args.uuid, args.on)
    return {
        **_instance(inst),
        "busy": args.on,
    }, f"{'busy' if args.on else 'idle'}: {_describe(inst)}"


def _fail(args: argparse.Namespace, path: Path) -> tuple[Any, str]:
    if args.card is not None:
        if args.xid is None or args.times is not None:
            raise ValueError("fail --card takes --xid (and --instance), not --times")
        result = _driver(path).fail_card(args.card, args.xid, args.instance)
        on = f"partition {args.instance} of card {args.card}" if args.instance else (
            f"card {args.card}")
        return result, f"{on} reported XID {args.xid}"
    if args.times is None or args.xid is not None or args.instance is not None:
        raise ValueError("fail --op takes --times (and --error), not --xid or --instance")
    result = _driver(path).fail(args.op, args.times, args.error)
    return result, f"the next {args.times} {args.op} calls fail with {args.error}"


def _recover(args: argparse.Namespace, path: Path) -> tuple[Any, str]:
    result = _driver(path).recover_card(args.card)
    return result, f"card {args.card} was reset and answers again"


def _reboot(args: argparse.Namespace, path: Path) -> tuple[Any, str]:
    result = _driver(path).reboot()
    gone = sum(len(uuids) for uuids in result["removed"].values())
    return result, f"rebooted: {gone} partitions removed from {len(result['removed'])} cards"


def _latency(args: argparse.Namespace, path: Path) -> tuple[Any, str]:
    result = _driver(path).latency(args.op, args.ms)
    return result, f"every {args.op} now takes {args.ms} ms"


def _instance(inst: Instance) -> dict[str, Any]:
    return {
        "card": inst.card,
        "gi_id": inst.gi_id,
        "ci_id": inst.ci_id,
        "uuid": inst.uuid,
        "profile": inst.profile,
        "start": inst.start,
        "size": inst.size,
    }


def _describe(inst: Instance) -> str:
    return f"{inst.profile} at start {inst.start} on card {inst.card}, GI {inst.gi_id}, {inst.uuid}"


def _table(view: dict[str, Any]) -> str:
    lines: list[str] = []
    for card in view["cards"]:
        lines.append(f"card {card['index']}  {card['model']}  {card['mode']}  {card['uuid']}")
        if not card["instances"]:
            lines.append("  (no instances)")
            continue
        lines.append(
            f"  {'GI':>3} {'CI':>3}  {'PROFILE':<10} {'START':>5} {'SIZE':>4}  "
            f"{'BUSY':<4}  {'STATE':<10}  {'ORIGIN':<6}  UUID"
        )
        for i in card["instances"]:
            origin = "carved" if i.get("carved") else "driver"
            busy = "yes" if i["busy"] else "no"
            state = i.get("state", "ready")
            lines.append(
                f"  {i['gi_id']:>3} {i['ci_id']:>3}  {i['profile']:<10} {i['start']:>5} "
                f"{i['size']:>4}  {busy:<4}  {state:<10}  {origin:<6}  {i['uuid']}"
            )
    faults = [
        f"{op} x{f['times']} ({f['error']})"
        for op, f in view.get("faults", {}).items()
        if f["times"]
    ]
    latencies = [f"{op} {ms} ms" for op, ms in view.get("latency_ms", {}).items() if ms]
    if faults:
        lines.append("injected failures: " + ", ".join(faults))
    if view.get("lost"):
        lines.append("lost cards: " + ", ".join(str(c) for c in view["lost"]))
    if latencies:
        lines.append("latencies: " + ", ".join(latencies))
    return "\n".join(lines)
