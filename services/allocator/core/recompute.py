"""The coalescing recompute: on any change, read fresh state, push token health, publish capacity.

Triggers (they carry no data; see `changes`): the claims bucket (a KV watch of this node's keys),
the pk-pods mirror (a Pod's death, or its record's expiry), the hardware poll (foreign instances
appear and vanish without a claim), and every Allocate. A pass takes a few milliseconds, so an
update reaches kubelet well within 100 ms. A failed read keeps the last advertised lists: nothing
is concluded from a partial read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import msgspec
from nats.js.kv import KeyValue

from partkeeper import backoff
from partkeeper.bus import kv as bus_kv
from partkeeper.drivers import Instance
from partkeeper.lifecycle import woken_or_timeout
from partkeeper.telemetry import metrics, partitions
from schemas import Claim, NodeCapacity, encode
from schemas.names import BUCKET_CLAIMS, capacity_key, claims_prefix, decode_token
from services.allocator.core import sliced
from services.allocator.core.advertise import advertise, same
from services.allocator.core.state import Context, SnapshotError, read, read_instances

log = logging.getLogger(__name__)

# After a pass the loop rests as long as the pass took, and at least MIN_REST: however fast changes
# come, recomputing takes at most half of the event loop's time (lists kubelet reads once), and a
# change that follows a short pass is taken a few milliseconds later. A fixed 20 ms pace made the
# reclaim's second claim change (the removal, some 10 ms after `releasing`) wait for it.
MIN_REST = 0.002
# A pass waits (`Context.quiet`) for the Allocates in flight to finish: they are on kubelet's
# critical path and the pass would only compete with them; every Allocate touches when it ends.


class Board(Protocol):
    """Where a mode shows kubelet each token's health: device-plugin mode's ListAndWatch
    (`deviceplugin.plugin.Board`); DRA mode has none (its devices are in the ResourceSlices)."""

    def post(self, health: Mapping[str, bool]) -> bool: ...


# ResourceClaim UID -> the containers of Pods using it, as DRA mode knows them.
Users = Callable[[], Mapping[str, Sequence[partitions.User]]]


class Recompute:
    def __init__(self, ctx: Context, boards: Mapping[str, Board], capacity_kv: KeyValue,
                 users: Users | None = None) -> None:
        self.ctx = ctx
        self.boards = boards
        self.capacity_kv = capacity_kv
        self.published: NodeCapacity | None = None
        # A failed pass or publish is retried by touching the changes after the schedule's wait:
        # the pass itself stays the one place the lists are computed.
        self.reading = backoff.Failures("capacity not recomputed",
                                        backoff.Schedule(base=0.2, cap=5.0))
        self.publishing = backoff.Failures("publishing capacity to pk-capacity")
        # The instances the last pass advertised: the hardware poll compares against these, not
        # against its own previous reading, so a change it saw only the end of is not missed.
        self.advertised: Mapping[int, tuple[Instance, ...]] | None = None
        # Which Pod runs on which partition (`partkeeper_partition_info`), from each pass's read.
        self.partitions = partitions.PartitionInfo(metrics.PARTITION_INFO)
        self.users = users or dict  # DRA mode: who uses each ResourceClaim (dra/users.py)
        self.pushed = 0  # the number (Changes.passes) of the last pass that pushed its lists
        self._pushed = asyncio.Event()  # replaced after every such pass: a wake-up, no data

    async def run(self, first: asyncio.Event) -> None:
        """Recompute on every change until cancelled; `first` is set after the first full pass."""
        loop = asyncio.get_running_loop()
        while True:
            await self.ctx.changes.pending()
            number = self.ctx.changes.passes
            await self.ctx.quiet()
            started = loop.time()
            if await self.once():
                first.set()
                self.pushed = number
                fired, self._pushed = self._pushed, asyncio.Event()
                fired.set()
            await asyncio.sleep(max(MIN_REST, loop.time() - started))

    async def once(self) -> bool:
        try:
            snap = await read(self.ctx)
        except SnapshotError as exc:
            wait = self.reading.failed(exc, "keeping the last lists, again")
            asyncio.get_running_loop().call_later(wait, self.ctx.changes.touch)
            return False
        self.reading.succeeded()
        _record_claims(self.ctx, snap.claims)
        self.partitions.show(partitions.series(
            snap.claims, snap.instances, {i: c.uuid for i, c in snap.cards.items()},
            lost=snap.lost, users=self.users()))
        self.advertised = snap.instances
        advert = advertise(self.ctx.offers, snap, self.ctx.node, time.time())
        for resource, health in advert.health.items():
            board = self.boards.get(resource)  # DRA mode has no device-plugin boards
            if board is not None:
                board.post(health)
        _record_metrics(self.ctx, advert.capacity)
        await self._publish(advert.capacity)
        return True

    async def refresh(self, timeout: float) -> bool:
        """Wake the recompute and wait, at most `timeout` seconds, until a pass that read the
        state after this call has pushed its lists; False when none did in time.

        Waiting here never delays the loop: the pass runs as it would for any other wake-up.
        """
        # The pass that reads after this touch is the next one `pending` lets through: one in
        # progress may have read before it.
        wanted = self.ctx.changes.passes + 1
        self.ctx.changes.touch()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.pushed < wanted:
            left = deadline - loop.time()
            if left <= 0:
                return False
            await woken_or_timeout(self._pushed, left)
        return True

    async def poll_hardware(self) -> None:
        """Touch when the cards' instances differ from the ones last advertised: instances made
        or destroyed outside partkeeper change no claim, so nothing else would notice."""
        async def poll() -> None:
            await self.ctx.quiet()  # an enumeration now would hold up an Allocate's create
            # A card that cannot be read is the recompute's to report; the poll only looks again.
            with contextlib.suppress(SnapshotError):
                current = await read_instances(self.ctx)
                if self.advertised is not None and current != self.advertised:
                    self.ctx.changes.touch()

        await backoff.every("polling the cards' instances",
                            self.ctx.options.hardware_poll_seconds, poll)

    async def _publish(self, doc: NodeCapacity) -> None:
        # Who enforces the slices, for `partkeeper status` (set at start, partkeeper.limiter).
        doc = msgspec.structs.replace(doc, slice_limiter=sliced.limiter_view(self.ctx),
                                      allocator_mode=self.ctx.config.mode)
        if same(doc, self.published):
            return
        try:
            await self.capacity_kv.put(capacity_key(self.ctx.node), encode(doc))
        except Exception as exc:
            wait = self.publishing.failed(exc)
            asyncio.get_running_loop().call_later(wait, self.ctx.changes.touch)
            return
        self.publishing.succeeded()
        self.published = doc


CLAIM_STATES = ("creating", "active", "releasing")


def _record_claims(ctx: Context, claims: list[Claim]) -> None:
    """Claims by profile and state, every pair (a count that drops to 0 says 0), and who
    enforces the slices."""
    counts: Counter[tuple[str, str]] = Counter((c.profile, str(c.state)) for c in claims)
    for offer in ctx.offers.values():
        for state in CLAIM_STATES:
            metrics.CLAIMS.labels(offer.profile, state).set(counts[(offer.profile, state)])
    found = ctx.limiter
    metrics.SLICE_LIMITER.labels(found.name, "true" if found.enforced else "false").set(1)


def _record_metrics(ctx: Context, doc: NodeCapacity) -> None:
    for resource, cap in doc.resources.items():
        metrics.CAPACITY.labels(resource, "healthy").set(cap.healthy)
        metrics.CAPACITY.labels(resource, "unhealthy").set(cap.unhealthy)
    for offer in ctx.offers.values():
        metrics.FREE_PLACEMENTS.labels(offer.profile).set(doc.resources[offer.resource].free)


async def watch_claims(ctx: Context, kv: KeyValue, ready: asyncio.Event) -> None:
    """Touch on every change of this node's claim documents (whoever wrote it), and tell the
    views each document's newest revision; `ready` is set once the documents present at the
    start have been seen.

    The watch (bus/kv.py, headers only) goes through the connection: `kv`, the claims bucket's
    handle that dra/main.py passes too, is not needed for it."""
    del kv
    prefix = claims_prefix(ctx.node)

    async def follow() -> None:
        watch = bus_kv.watch(ctx.nc, BUCKET_CLAIMS, f"{prefix}*", meta_only=True,
                             label="allocator-claims")
        try:
            async with contextlib.aclosing(watch) as entries:
                async for entry in entries:
                    if entry is None:
                        ctx.views.replayed()
                        ready.set()
                    elif (card := decode_token(entry.key[len(prefix):])).isdigit():
                        ctx.views.saw(int(card), entry.revision or 0)
                    ctx.changes.touch()
        finally:
            ctx.views.lost()  # until the next watch's replay has come

    await backoff.keep_following("watching pk-claims", follow, after_gap=ctx.changes.touch)
