"""The allocator's state: what its parts share (`Context`, built once at start by
`build.context`), how its reads are made, and how long they are waited for.

## Context

The node's cards and offers, the Pod view, the claims store, the driver (one call at a time, in a
worker thread: `hardware`), the card health, and the count of Allocates and prepares in flight
(`serving`, `quiet`).

## Wake-ups (`Changes`)

Wake-ups that carry no data: whoever wakes reads the state itself. A change of the claims, of a
Pod's state or of the hardware calls `touch()`. The recompute loop waits on a coalescing flag (many
touches while it works make one more pass, never a queue), and an `Allocate` waiting for room
waits for the next touch after the read it acted on.

## Views: what an Allocate (or a DRA prepare) may plan on without reading it again

- **Claims**: the document of a card this process last read or wrote (`ClaimsStore.last`), while
  the claims watch has delivered no newer revision of it. Only the allocator adds claims, and its
  own writes are in that document the moment they land, so what the view can miss is another
  writer's change of the last few milliseconds (the reclaimer's release or removal). A plan on it
  is checked by the compare-and-set of the claim write, which a stale revision fails; the store
  then reads afresh.
- **Instances**: the cards' instances as this process last enumerated them, while no claim
  revision has moved and this process has not asked the driver to change a card since. Another
  service destroys an instance only between two claim writes (the reclaimer's release and
  removal), so the stamp moves with it. What it cannot see is a partition carved by hand in that
  window: the driver refuses a create over it (`PlacementError`), and the Allocate plans again on
  a fresh read.

Everything that concludes from what it read rather than writing against a revision reads
afresh: the recompute (what is advertised), a retried Allocate and a token kubelet handed on, the
room-making and the refusal's account. A plan on the views that finds no room is made again on a
fresh read before any of those.

## Reads (`read`, `read_claims`)

One consistent-enough read of everything a decision needs: claims, hardware, Pod states
(`placement.Snapshot`). A read is fresh (the claims from the store with their revisions, the
instances from the driver) unless its caller plans a write on it and takes the views: then what
is still current there is not read again, and the snapshot says it is not `fresh`. The Pod
states come from the pk-pods mirror. A failed read of any card fails the whole snapshot
(`SnapshotError`): nothing is ever concluded from a partial enumeration (invariant 9).

## Patience: a store that does not answer is waited for, bounded, then fails closed

During a JetStream election (one server of three down, a quorum left) or a single server's
restart of a few seconds, reads and CAS writes of the claims time out or answer "JetStream system
temporarily unavailable". Refusing the Allocate then fails a Pod for a bus hiccup (for good, with
`restartPolicy: Never`). So the Allocate's store calls go through `waiting`: a call that fails
because the store is unreachable is tried again with backoff until `Options.room_wait_seconds`
(the same budget as the wait for room) has passed; then the last error is raised and the caller
refuses as before. Anything else (a conflict, an undecodable document, a driver error) is raised
at once. Cancellation (kubelet gave up) ends the wait at once: no catch of CancelledError here.

The Pod lookups of an Allocate (`pods.get`) wait the same way for a watcher that gives no usable
answer (`answered`): during an election the watcher cannot persist what its fresh LIST saw and
answers with an error. An Allocate passes its one deadline (`until`) to every such wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats.errors
import nats.js.errors

from partkeeper import backoff, limiter
from partkeeper.bus import RemoteError, Unanswered
from partkeeper.bus.rpc import BAD_REQUEST
from partkeeper.claims import StoreReadError
from partkeeper.drivers import Card, DriverError, Instance
from partkeeper.drivers.base import CardLostError
from partkeeper.drivers.cardhealth import CardHealth
from partkeeper.lifecycle import woken_or_timeout
from partkeeper.limiter import NONE, LimiterState
from partkeeper.nodeparts import NodeParts
from schemas import CardClaims, Claim
from services.allocator.core.catalog import Offer
from services.allocator.core.options import Options
from services.allocator.core.placement import Snapshot
from services.allocator.core.podview import PodView

T = TypeVar("T")
log = logging.getLogger(__name__)


class Changes:
    def __init__(self) -> None:
        self._dirty = asyncio.Event()
        self._next = asyncio.Event()
        self.touches = 0  # how many changes were signalled
        self.passes = 0  # how many recompute passes they caused

    def touch(self) -> None:
        self.touches += 1
        self._dirty.set()
        fired, self._next = self._next, asyncio.Event()
        fired.set()

    async def pending(self) -> None:
        """Return once something changed since the last return (the recompute loop's wait)."""
        await self._dirty.wait()
        self._dirty.clear()
        self.passes += 1

    def next_change(self) -> asyncio.Event:
        """An event set by the next touch. Take it *before* reading, then wait on it."""
        return self._next


Enumeration = dict[int, tuple[Instance, ...]]


@dataclass
class Views:
    loaded: bool = False  # the claims watch has delivered every document present at its start
    revisions: dict[int, int] = field(default_factory=dict)  # card -> newest revision delivered
    moves: int = 0  # claim revisions delivered plus this process's own driver changes
    _enumerated: tuple[int, Enumeration] | None = None

    def saw(self, card: int, revision: int) -> None:
        """The claims watch delivered `revision` of the card's document."""
        if revision > self.revisions.get(card, 0):
            self.revisions[card] = revision
            self.moves += 1

    def replayed(self) -> None:
        self.loaded = True

    def lost(self) -> None:
        """The watch lost its place: nothing is current until its next replay has come."""
        self.loaded = False
        self.moves += 1

    def current(self, card: int, revision: int) -> bool:
        """Whether a document of the card at `revision` is the newest the watch has shown."""
        return self.loaded and revision >= self.revisions.get(card, 0)

    def changed_hardware(self) -> None:
        """This process asked the driver to create or destroy (whatever came of it)."""
        self.moves += 1

    def stamp(self) -> int:
        """Taken before an enumeration starts: a move during it makes the result stale."""
        return self.moves

    def enumerated(self, stamp: int, instances: Enumeration | None) -> None:
        """The result of an enumeration started at `stamp`; None: it failed, and nothing is
        planned on the views' instances until one succeeds (invariant 9)."""
        self._enumerated = None if instances is None else (stamp, instances)

    def instances(self) -> Enumeration | None:
        """The last enumeration, if nothing has moved since it started."""
        if self.loaded and self._enumerated is not None and self._enumerated[0] == self.moves:
            return self._enumerated[1]
        return None



# How long work kubelet does not wait for waits for the Allocates in flight: bounded, so that a
# stream of them never starves it.
QUIET_WAIT_SECONDS = 0.05


@dataclass
class Context(NodeParts):
    cards: tuple[Card, ...]
    offers: dict[str, Offer]
    pods: PodView
    changes: Changes
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
    # The claims and instances an Allocate may plan on without reading them again (py).
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



class SnapshotError(Exception):
    """The claims or the hardware could not be read completely."""


async def read_instances(ctx: Context) -> dict[int, tuple[Instance, ...]]:
    """Every partition-mode card's instances, in one thread hop, kept in the views. Raises
    SnapshotError."""
    partition_cards = [c.index for c in ctx.cards if c.mode == "partition"]

    def enumerate_all() -> dict[int, tuple[Instance, ...]]:
        found: dict[int, tuple[Instance, ...]] = {}
        for card in partition_cards:
            # A lost card answers nothing until it is reset: it is marked failed (nothing is
            # placed on it, none of its room counted) and listed empty, and the other cards
            # still serve. Its claims stay as they are; nothing concludes from its absence.
            try:
                found[card] = tuple(ctx.driver.instances(card))
            except CardLostError as exc:
                if card not in ctx.lost:
                    log.error("card %d is lost (%s): no partition is placed on it", card, exc)
                ctx.lost.add(card)
                found[card] = ()
            else:
                ctx.lost.discard(card)
        return found

    stamp = ctx.views.stamp()
    try:
        found = await ctx.hardware(enumerate_all)
    except DriverError as exc:
        ctx.views.enumerated(stamp, None)
        raise SnapshotError(f"enumerating the cards failed: {exc}") from exc
    ctx.views.enumerated(stamp, found)
    return found


@dataclass(frozen=True, slots=True)
class ClaimsRead:
    docs: dict[int, CardClaims]
    revisions: dict[int, int]
    fresh: bool = True  # False: some documents came from the views

    @property
    def claims(self) -> list[Claim]:
        return [c for card in sorted(self.docs) for c in self.docs[card].claims.values()]


async def read_claims(ctx: Context, *, views: bool = False) -> ClaimsRead:
    """Every card's claims document and revision, read concurrently; with `views`, a document
    still current in the views is taken from there. Raises SnapshotError."""
    cards = [c.index for c in ctx.cards]
    taken = {card: known for card in cards
             if views and (known := current_claims(ctx, card)) is not None}
    wanted = [card for card in cards if card not in taken]
    try:
        read_docs = await asyncio.gather(*(ctx.store.read(card) for card in wanted))
    except StoreReadError as exc:
        raise SnapshotError(f"reading the claims failed: {exc}") from exc
    found = taken | dict(zip(wanted, read_docs, strict=True))
    return ClaimsRead({card: found[card][0] for card in cards},
                      {card: found[card][1] for card in cards}, fresh=not taken)


def current_claims(ctx: Context, card: int) -> tuple[CardClaims, int] | None:
    """The card's document as this process last read or wrote it, if no newer revision has been
    delivered by the claims watch since (py)."""
    known = ctx.store.last(card)
    return known if known is not None and ctx.views.current(card, known[1]) else None


async def read(ctx: Context, claims: ClaimsRead | None = None) -> Snapshot:
    """A fresh snapshot; `claims`, when given, is a read of the claims just made, taken instead
    of reading them again, for a plan checked by the compare-and-set of the claim write. With it
    the instances come from the views too, when still current there."""
    known = claims if claims is not None else await read_claims(ctx)
    instances = ctx.views.instances() if claims is not None else None
    fresh = known.fresh and instances is None
    if instances is None:
        instances = await read_instances(ctx)
    uids = {c.pod_uid for doc in known.docs.values() for c in doc.claims.values()}
    dead = frozenset(uid for uid in uids if ctx.pods.dead(uid))
    return Snapshot({c.index: c for c in ctx.cards}, known.docs, known.revisions, instances,
                    ctx.driver.same_partition, dead, time.time(), fresh, ctx.health,
                    frozenset(ctx.lost))



UNAVAILABLE_CODES = frozenset({408, 503})


def unreachable(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, says the store could not be reached."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, nats.js.errors.APIError):
            if seen.code in UNAVAILABLE_CODES:
                return True
        elif isinstance(seen, TimeoutError | nats.errors.Error):
            return True
        seen = seen.__cause__
    return False


def unanswered(exc: BaseException) -> bool:
    """No usable answer from a peer service, except a refusal of the request itself."""
    if isinstance(exc, RemoteError):
        return exc.code != str(BAD_REQUEST)
    return isinstance(exc, Unanswered)


def deadline(ctx: Context) -> float:
    return asyncio.get_running_loop().time() + ctx.options.room_wait_seconds


async def waiting(
    ctx: Context, what: str, call: Callable[[], Awaitable[T]], until: float | None = None
) -> T:
    """`await call()`, again while the store is unreachable, until `until` (loop time; the
    allocation's deadline) or, without one, for at most the room budget from now."""
    return await _again(deadline(ctx) if until is None else until, what,
                        "the claims store is unreachable", unreachable, call)


async def answered(until: float, what: str, call: Callable[[], Awaitable[T]]) -> T:
    """`await call()`, again while the peer gives no usable answer, until `until` (loop time)."""
    return await _again(until, what, "no usable answer", unanswered, call)


async def _again(
    until: float, what: str, trouble: str, transient: Callable[[BaseException], bool],
    call: Callable[[], Awaitable[T]],
) -> T:
    return await backoff.retry(
        f"{what}: {trouble}", call, transient=transient, schedule=backoff.Schedule(0.1, 2.0),
        deadline=until, doing="asked again before the Allocate is refused",
    )
