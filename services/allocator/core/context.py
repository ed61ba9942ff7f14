"""What the allocator's parts share, built once at start by `main.serve`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from partkeeper import limiter
from partkeeper.drivers import Card
from partkeeper.drivers.cardhealth import CardHealth
from partkeeper.lifecycle import woken_or_timeout
from partkeeper.limiter import NONE, LimiterState
from partkeeper.nodeparts import NodeParts
from services.allocator.core.catalog import Offer
from services.allocator.core.changes import Changes
from services.allocator.core.options import Options
from services.allocator.core.podresources import PodResources
from services.allocator.core.podview import PodView
from services.allocator.core.views import Views

T = TypeVar("T")
log = logging.getLogger(__name__)

# How long work kubelet does not wait for waits for the Allocates in flight: bounded, so that a
# stream of them never starves it.
QUIET_WAIT_SECONDS = 0.05


@dataclass
class Context(NodeParts):
    cards: tuple[Card, ...]
    offers: dict[str, Offer]
    pods: PodView
    changes: Changes
    podres: PodResources
    options: Options = field(default_factory=Options)
    # Who enforces logical slices, as found at start (partkeeper.limiter.check).
    limiter: LimiterState = field(default_factory=lambda: LimiterState(NONE, enforced=False))
    # Serialises "plan, then write the creating claims" inside this process; across processes the
    # compare-and-set on each card's document does the same job.
    placing: asyncio.Lock = field(default_factory=asyncio.Lock)
    # One driver call at a time from this process: NVML and the sim driver's file lock serialise
    # anyway, and queueing here spares the threads the file lock's polling.
    driving: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Allocates (and DRA prepares) in flight: the recompute and the audit announcements wait,
    # briefly, for them to end (`quiet`).
    allocating: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # The claims and instances an Allocate may plan on without reading them again (views.py).
    views: Views = field(default_factory=Views)
    # The node's card health as the card watch last folded it (core/health.py), and the cards
    # an enumeration found lost before the watch said so: nothing new is placed on either.
    health: CardHealth = field(default_factory=CardHealth)
    lost: set[int] = field(default_factory=set)

    def failed_cards(self) -> frozenset[int]:
        return self.health.failed_cards() | frozenset(self.lost)

    def find_limiter(self) -> None:
        """Who enforces this node's slices (blocking: a few stats). A configured limiter whose
        files are missing refuses the start (StartupError) on a node with sliced cards; a node
        without any (the same ConfigMap on a MIG-only node) has nothing to enforce and starts."""
        if not any(card.mode == "sliced" for card in self.cards):
            self.limiter = limiter.state(self.config)
            log.info("no sliced card on this node; PK_SLICE_LIMITER=%s has nothing to enforce",
                     self.limiter.name, extra={"slice_limiter": self.limiter.name})
            return
        self.limiter = limiter.check(self.config)
        if self.limiter.name == limiter.HAMI_CORE:
            limiter.ensure_lock_dir(self.options.limiter_lock_dir)
        log.info("%s", self.limiter.sentence(), extra={
            "slice_limiter": self.limiter.name, "slices_enforced": self.limiter.enforced})

    def card(self, index: int) -> Card:
        return next(c for c in self.cards if c.index == index)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Count an Allocate or a prepare in flight (kubelet waits for it)."""
        self.allocating += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.allocating -= 1
            if not self.allocating:
                self.idle.set()

    async def quiet(self, limit: float = QUIET_WAIT_SECONDS) -> None:
        """Return once no Allocate or prepare is in flight, or after `limit` seconds: work that
        kubelet does not wait for (a recompute pass, an audit entry) would only compete with
        them for the event loop."""
        if self.allocating:
            await woken_or_timeout(self.idle, limit)

    async def hardware(self, call: Callable[..., T], *args: Any) -> T:
        """Run a (blocking) driver call in a worker thread. A cancelled caller still waits for
        the thread, which cannot be stopped, before letting the next call in."""
        async with self.driving:
            work = asyncio.create_task(asyncio.to_thread(call, *args), name="driver call")
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                while not work.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([work])
                raise

    async def change_hardware(self, call: Callable[..., T], *args: Any) -> T:
        """`hardware` for a call that creates or destroys: the enumeration in the views is stale
        after it, whatever came of it."""
        try:
            return await self.hardware(call, *args)
        finally:
            self.views.changed_hardware()
