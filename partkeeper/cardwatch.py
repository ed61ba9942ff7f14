"""The node's card-health watcher: the shell around `drivers/cardhealth.py`.

It reads the driver's event source in a worker thread (NVML's wait blocks in C), classifies each
event with the operator's XID switches, folds the faults into the node's `CardHealth` and hands
every change to its owner (`on_change`), which stops offering what failed and tells the Pods on
it. Every event is counted (`partkeeper_card_events_total{card,cause}`) and logged with what the
driver said; a failed card shows as `partkeeper_card_failed_devices{card,cause}` 1 until it
recovers.

A source that cannot be read any more is opened again with the project's backoff; events raised
while it was closed are missed, as they are by NVIDIA's device plugin, and a card lost meanwhile is
found by the next reads of it (CardLostError). The health state lives in this process: a restart
starts with every card healthy and learns again, as the device plugin does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from partkeeper import backoff
from partkeeper.drivers.cardhealth import (
    CardEvent,
    CardHealth,
    EventSource,
    Fault,
    Scope,
    XidPolicy,
    classify,
)
from partkeeper.telemetry.metrics import CARD_EVENTS, CARD_FAILED

log = logging.getLogger(__name__)

# One wait of the worker thread: how long a stop waits for it to come back (NVIDIA's device
# plugin waits 5 s; a shorter wait only costs an idle call per second).
WAIT_SECONDS = 1.0

OnChange = Callable[[CardHealth, Fault, CardEvent], Awaitable[None]]


class CardWatch:
    """`run()` until cancelled; `health` is the node's state as last folded."""

    def __init__(
        self, open_source: Callable[[], EventSource | None], rules: XidPolicy,
        on_change: OnChange,
    ) -> None:
        self._open = open_source
        self._rules = rules
        self._on_change = on_change
        self.health = CardHealth()
        # Set once the first open has been tried: when it succeeded, events raised from then on
        # are seen. The owner waits for it before it says it is ready; a source that cannot be
        # opened is retried with backoff and holds nothing up.
        self.opened = asyncio.Event()

    async def run(self) -> None:
        await backoff.keep_following("reading card events", self._follow)

    async def _follow(self) -> None:
        try:
            source = await asyncio.to_thread(self._open)
        finally:
            self.opened.set()
        if source is None:
            log.info("the driver reports no card events; card health is not watched")
            await asyncio.Event().wait()  # until cancelled: nothing to read, nothing to retry
            return
        waiting: asyncio.Future[list[CardEvent]] | None = None
        loop = asyncio.get_running_loop()
        try:
            while True:
                # A plain executor future, not a task: nothing cancels it but its thread's end.
                waiting = loop.run_in_executor(None, source.wait, WAIT_SECONDS)
                for event in await asyncio.shield(waiting):
                    await self.take(event)
        finally:
            # A cancelled await leaves the worker thread inside the library's wait: freeing the
            # event set under it is what NVML forbids (the fake NVML reports it). The source is
            # closed once that wait returns, without holding up the stop (a service's stop
            # cancels again after half a second, and a task slow to end would be cut short).
            if waiting is not None and not waiting.done():
                waiting.add_done_callback(lambda done: _close(source, done))
            else:
                _close(source, waiting)

    async def take(self, event: CardEvent) -> None:
        """Fold one event in; the owner hears of it when it changed what is failed."""
        fault = classify(event, self._rules)
        CARD_EVENTS.labels(str(event.card), fault.cause).inc()
        where = f"card {event.card}"
        if fault.instance is not None:
            where += f", GPU instance {fault.instance[0]} compute instance {fault.instance[1]}"
        said = f" ({event.detail})" if event.detail else ""
        if fault.scope is Scope.NONE:
            log.info("%s: %s%s; nothing fails (not a fatal event)", where, fault.meaning, said)
            return
        changed = self.health.apply(fault)
        if changed == self.health:
            log.info("%s: %s%s; already failed", where, fault.meaning, said)
            return
        before, self.health = self.health, changed
        self._gauge(before, changed)
        if fault.scope is Scope.RECOVERED:
            log.warning("%s: %s%s; it is offered again", where, fault.meaning, said)
        elif fault.scope is Scope.CARD:
            log.error("%s: %s%s; no partition is placed on it until it recovers, "
                      "and its Pods are told", where, fault.meaning, said)
        else:
            log.error("%s: %s%s; the Pod on this partition is told", where, fault.meaning, said)
        await self._on_change(changed, fault, event)

    @staticmethod
    def _gauge(before: CardHealth, after: CardHealth) -> None:
        for card, fault in before.cards:
            if after.card_fault(card) is None:
                CARD_FAILED.labels(str(card), fault.cause).set(0)
        for card, fault in after.cards:
            CARD_FAILED.labels(str(card), fault.cause).set(1)


def _close(source: EventSource, last: asyncio.Future[list[CardEvent]] | None) -> None:
    if last is not None and not last.cancelled():
        last.exception()  # retrieved: a wait that failed as the source closed is not news
    with contextlib.suppress(Exception):  # closing a broken source: nothing to keep
        source.close()
