"""What the allocator's parts share, built once at start by `main.serve`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from partkeeper import limiter
from partkeeper.drivers import Card
from partkeeper.limiter import NONE, LimiterState
from partkeeper.nodeparts import NodeParts
from services.allocator.catalog import Offer
from services.allocator.changes import Changes
from services.allocator.options import Options
from services.allocator.podresources import PodResources
from services.allocator.podview import PodView

T = TypeVar("T")
log = logging.getLogger(__name__)


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
    # Allocates in flight; the recompute defers (briefly) to them, see recompute.DEFER.
    allocating: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

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
