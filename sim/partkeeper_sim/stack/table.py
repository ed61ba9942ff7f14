"""The demo's live view: cards, partitions and claims, and the scenario's progress.

On a terminal it is a rich `Live` display redrawn from the latest snapshot, which a background
task refreshes when something changes (at most a few times a second): `partkeeper status` (NATS
only) plus the simulated driver's list, which alone knows which instance is busy. When stdout is
not a terminal (CI), it prints one plain line per step and per event instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from partkeeper_sim.stack.observe import Observer, woken_or_timeout
from partkeeper_sim.stack.probe import Probe

REDRAW_SECONDS = 0.3
NOTES_SHOWN = 8
# On a terminal a person watches: each step's outcome stays on screen this long before the next
# step starts. Only the live view pauses; CI runs go at full speed.
PACE_SECONDS = 1.0


class View(Protocol):
    async def start(self, probe: Probe, observer: Observer, steps: int) -> None: ...
    def step(self, index: int, title: str) -> None: ...
    def note(self, text: str) -> None: ...
    async def pause(self) -> None: ...
    async def stop(self) -> None: ...


def make_view(console: Console) -> View:
    return LiveView(console) if console.is_terminal else PlainView(console)


class PlainView:
    """One line per step and per event, with the time since the start: readable in CI logs."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self.steps = 0

    async def start(self, probe: Probe, observer: Observer, steps: int) -> None:
        self.started, self.steps = time.monotonic(), steps

    def _print(self, text: str) -> None:
        self.console.print(f"+{time.monotonic() - self.started:6.2f}s {text}", markup=False,
                           highlight=False, soft_wrap=True)

    def step(self, index: int, title: str) -> None:
        self._print(f"[step {index}/{self.steps}] {title}")

    def note(self, text: str) -> None:
        self._print(f"  {text}")

    async def pause(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class LiveView:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.notes: list[str] = []
        self.title = "starting"
        self.snapshot: tuple[dict[str, Any], dict[str, Any]] | None = None
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), console=console)
        self.task = self.progress.add_task("scenario", total=1)
        self.observer: Observer | None = None
        self.probe: Probe | None = None
        self.live: Live | None = None
        self.refresher: asyncio.Task[None] | None = None

    async def start(self, probe: Probe, observer: Observer, steps: int) -> None:
        self.observer, self.probe = observer, probe
        self.progress.update(self.task, total=steps)
        self.live = Live(_Screen(self), console=self.console, refresh_per_second=4)
        self.live.start()
        self.refresher = asyncio.create_task(self._refresh(probe, observer), name="demo view")

    def step(self, index: int, title: str) -> None:
        self.title = title
        self.progress.update(self.task, completed=index - 1, description=f"step {index}: {title}")

    def note(self, text: str) -> None:
        self.notes = [*self.notes, text][-NOTES_SHOWN:]

    async def pause(self) -> None:
        await asyncio.sleep(PACE_SECONDS)

    async def stop(self) -> None:
        if self.refresher is not None:
            self.refresher.cancel()
            await asyncio.gather(self.refresher, return_exceptions=True)
            await self._snapshot(self.probe)  # the last frame shows the final state
        self.progress.update(self.task, completed=self.progress.tasks[0].total)
        if self.live is not None:
            self.live.refresh()
            self.live.stop()

    async def _refresh(self, probe: Probe, observer: Observer) -> None:
        with observer.wakeups.listen() as woken:
            while True:
                woken.clear()
                await self._snapshot(probe)
                await asyncio.sleep(REDRAW_SECONDS)  # coalesces bursts of changes
                await woken_or_timeout(woken, 2.0)

    async def _snapshot(self, probe: Probe | None) -> None:
        if probe is None:
            return
        with contextlib.suppress(Exception):  # a view must never stop the demo
            self.snapshot = (await probe.status(), await probe.sim())

    def render(self) -> RenderableType:
        parts: list[RenderableType] = [self.progress]
        if self.observer is not None:
            parts.append(Text(counts_line(self.observer), style="bold"))
        if self.snapshot is not None:
            parts.extend(cards_tables(*self.snapshot))
        parts.extend(Text(f"  {line}", style="dim") for line in self.notes)
        return Group(*parts)


class _Screen:
    """Rendered afresh at every refresh of the Live display."""

    def __init__(self, view: LiveView) -> None:
        self.view = view

    def __rich__(self) -> RenderableType:
        return self.view.render()


def counts_line(observer: Observer) -> str:
    pods = list(observer.pods.values())
    running = sum(1 for p in pods if p.running and p.gone is None)
    return (f"Pods created {len(pods)} · running {running} · "
            f"refused {sum(1 for p in pods if p.refused)} · "
            f"reclaimed {sum(1 for p in pods if p.reclaimed is not None)} · "
            f"foreign seen {len(observer.foreign_seen)}")


def cards_tables(status: dict[str, Any], sim: dict[str, Any]) -> list[RenderableType]:
    """One table per card: each instance with its claim and Pod, and claims without one yet."""
    busy = {i["uuid"] for card in sim["cards"] for i in card["instances"] if i.get("busy")}
    destroying = {i["uuid"] for card in sim["cards"] for i in card["instances"]
                  if i.get("state") == "destroying"}
    tables: list[RenderableType] = []
    for card in status["cards"]:
        table = Table(title=f"card {card['index']} {card['model']} ({card['mode']})",
                      title_justify="left", expand=False)
        for column in ("slices", "profile", "instance", "claim", "Pod", "notes"):
            table.add_column(column)
        by_id = {c["id"]: c for c in card["claims"]}
        shown: set[str] = set()
        for inst in card["instances"]:
            claim = by_id.get((inst.get("claim") or {}).get("id", ""))
            shown.add(claim["id"] if claim else "")
            notes = [n for n, on in (("foreign", inst["foreign"]), ("busy", inst["uuid"] in busy),
                                     ("destroying", inst["uuid"] in destroying)) if on]
            table.add_row(_slices(inst["start"], inst["size"]), inst["profile"],
                          inst["uuid"][:12], _state(claim), _pod(claim), ", ".join(notes))
        for claim in card["claims"]:
            if claim["id"] not in shown:
                table.add_row(_slices(claim["start"], claim["size"]), claim["profile"], "-",
                              _state(claim), _pod(claim), claim["kind"])
        free = ", ".join(f"{p} {n}" for p, n in sorted(card["free"].items()) if n) or "none"
        table.caption = f"free: {free}; pending reclaims {card['pending_reclaims']}"
        tables.append(table)
    return tables


def _slices(start: int, size: int) -> str:
    return f"{start}-{start + size - 1}" if size > 1 else str(start)


def _state(claim: dict[str, Any] | None) -> str:
    if claim is None:
        return "-"
    colour = {"active": "green", "creating": "cyan", "releasing": "yellow"}.get(claim["state"])
    return f"[{colour}]{claim['state']}[/{colour}]" if colour else claim["state"]


def _pod(claim: dict[str, Any] | None) -> str:
    return claim["name"] if claim else "-"
