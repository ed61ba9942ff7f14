"""The claims store on the pk-claims KV bucket: one document per card, every change a CAS.

`update(card, mutate)` is the one writer: read the document and its revision, apply a pure
mutation, write with "expected last revision", retry on a conflict. Nothing else calls put. The
revision fences the allocator and the reclaimer of a card across processes without a shared lock.

A store that `announce`s (the allocator's and the reclaimer's) is also the outbox of the audit
log (outbox.py): each write carries its transitions' `ClaimChanged` entries, published after the
write and stripped once published; `flush_outbox` re-sends whatever an earlier write or process
left there. The publish is not awaited by the writer: the entry is durable with the write, so
the caller (an Allocate, a release) goes on while one sender per card sends its entries in
write order; `drain` waits for them at a stop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from partkeeper import backoff, faults
from partkeeper.bus.kv import Bucket, entries
from partkeeper.bus.publish import publish
from partkeeper.claims import machine, outbox
from schemas import CardClaims, SchemaError, decode, encode
from schemas.names import claims_key, claims_prefix, decode_token, parts_subject

log = logging.getLogger(__name__)
CONFLICT_SCHEDULE = backoff.Schedule(base=0.002, cap=0.05)  # after a lost compare-and-set
PUBLISH_SECONDS = 2.0  # an audit publish that takes longer is left in the outbox for later

Mutation = Callable[[CardClaims], CardClaims]


class StoreReadError(Exception):
    """The claims could not be read (store unreachable, undecodable document). Fail closed."""


class ConflictExhausted(Exception):
    """Too many concurrent writers in a row; the caller should retry later."""


class ClaimsStore:
    def __init__(self, bucket: Bucket, node: str, *, max_conflicts: int = 64,
                 announce: bool = False) -> None:
        self.bucket = bucket
        self.kv = bucket.kv
        self.node = node
        self.max_conflicts = max_conflicts
        self.conflicts = 0  # CAS conflicts seen, for metrics and tests
        self.announce = announce
        self._published: dict[int, set[str]] = {}  # per card: outbox entries known to be sent
        self._order: dict[int, asyncio.Lock] = {}  # per card: its sends, one at a time, in order
        self._sending: set[asyncio.Task[None]] = set()
        self._last: dict[int, tuple[CardClaims, int]] = {}  # per card: the newest read or written
        # Awaited before each announcement: the allocator's waits (bounded) for the Allocates in
        # flight, so that the audit does not compete with them for the event loop.
        self.announce_after: Callable[[], Awaitable[None]] | None = None

    def last(self, card: int) -> tuple[CardClaims, int] | None:
        """The newest document of `card` this store has read or written, with its revision (no
        read: the caller judges whether it is still current: the allocator's `state.Views`)."""
        return self._last.get(card)

    def _saw(self, card: int, doc: CardClaims, revision: int) -> tuple[CardClaims, int]:
        known = self._last.get(card)
        if known is None or revision >= known[1]:  # reads may end out of order
            self._last[card] = (doc, revision)
        return doc, revision

    async def read(self, card: int) -> tuple[CardClaims, int]:
        """The card's document and its revision (0: no document yet). Raises StoreReadError."""
        key = claims_key(self.node, card)
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return self._saw(card, machine.empty(self.node, card), 0)
        except Exception as exc:
            raise StoreReadError(f"reading claims of card {card} failed: {exc}") from exc
        try:
            doc = decode(entry.value or b"", CardClaims, what=f"claims document {key}")
        except SchemaError as exc:
            raise StoreReadError(str(exc)) from exc
        if doc.card != card or doc.node != self.node:
            raise StoreReadError(f"claims document {key} names node {doc.node} card {doc.card}")
        return self._saw(card, doc, int(entry.revision or 0))

    async def cards(self) -> list[int]:
        """Cards that have a claims document. Raises StoreReadError."""
        prefix = claims_prefix(self.node)
        try:
            keys = list(await entries(self.bucket, f"{prefix}*"))
        except Exception as exc:
            raise StoreReadError(f"listing claim documents failed: {exc}") from exc
        return sorted(int(decode_token(k[len(prefix) :])) for k in keys if k.startswith(prefix))

    async def read_all(self, cards: list[int] | None = None) -> dict[int, tuple[CardClaims, int]]:
        """Every card's document. A failure on any card fails the whole read (never partial)."""
        wanted = sorted(set(cards or []) | set(await self.cards()))
        return {card: await self.read(card) for card in wanted}

    async def update(
        self, card: int, mutate: Mutation, *, reasons: Mapping[str, str] | None = None,
        known: tuple[CardClaims, int] | None = None,
    ) -> tuple[CardClaims, int]:
        """Apply `mutate` with compare-and-set; returns the written document and revision.

        `mutate` may raise TransitionError to refuse; nothing is written then. Returning the
        same object means "no change" and writes nothing. `reasons` (by claim id) go into the
        audit entries of this write's transitions (outbox.transitions).

        `known`: the document and revision the caller read or wrote a moment ago. The first
        attempt writes against it without reading; the revision makes that safe (a stale one is
        refused by the server). Only a write is taken from it: a mutation that changes nothing
        or refuses on it is judged again on a fresh read, so the outcome is the one without it.
        """
        key = claims_key(self.node, card)
        if known is not None:
            doc, revision = known
            try:
                new = mutate(doc)
            except Exception:
                new = doc  # judged again below, on a fresh read
            if new is not doc:
                done = await self._put(card, key, doc, revision, new, reasons)
                if done is not None:
                    return done

        async def fresh() -> tuple[CardClaims, int] | backoff.Again:
            doc, revision = await self.read(card)
            new = mutate(doc)
            if new is doc:
                return doc, revision
            done = await self._put(card, key, doc, revision, new, reasons)
            if done is None:
                self.conflicts += 1
                return backoff.Again("another writer moved the revision on")
            return done

        try:
            return await backoff.retry(
                f"writing the claims of card {card}", fresh, transient=backoff.never,
                schedule=CONFLICT_SCHEDULE, attempts=self.max_conflicts, doing="read again",
                level=logging.DEBUG)
        except backoff.GaveUp:
            raise ConflictExhausted(
                f"claims of card {card}: {self.max_conflicts} conflicts in a row") from None

    async def _put(
        self, card: int, key: str, doc: CardClaims, revision: int, new: CardClaims,
        reasons: Mapping[str, str] | None,
    ) -> tuple[CardClaims, int] | None:
        """Write `new`, mutated from `doc`, against `revision` with its audit entries, then send
        them; None when another writer has moved the revision on (nothing written)."""
        if self.announce:
            new = outbox.record(doc, new, self._published.get(card, set()), time.time(), reasons)
        try:
            if revision == 0:
                written = await self.kv.create(key, encode(new))
            else:
                written = await self.kv.update(key, encode(new), last=revision)
        except KeyWrongLastSequenceError:
            return None
        if self.announce:
            await faults.reach("claims.after_write")
            self._announce(card, new)
        return self._saw(card, new, int(written))

    def _announce(self, card: int, doc: CardClaims) -> None:
        """Send `doc`'s outbox after the writes before it, without making the writer wait: the
        entries are in the document already, so a send that never happens (a crash, a stop, a
        NATS outage) is one `flush_outbox` makes later. The task inherits the writer's trace,
        so each event still carries the `traceparent` of the operation that caused it."""
        lock = self._order.setdefault(card, asyncio.Lock())

        async def send() -> None:
            async with lock:  # FIFO: the entries leave in the order they were written
                if self.announce_after is not None:
                    await self.announce_after()
                await self._send(card, doc)

        task = asyncio.create_task(send(), name=f"announce card {card}")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def drain(self, timeout: float = PUBLISH_SECONDS) -> None:
        """Wait (bounded) for the announcements in flight, then drop what is left: it stays in
        the documents for the next `flush_outbox`. For a service's stop."""
        pending = set(self._sending)
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _send(self, card: int, doc: CardClaims) -> None:
        """Publish the outbox entries of `doc` not yet sent, oldest first, stopping at the first
        that fails (it and the rest stay recorded; `flush_outbox` or the next write re-sends)."""
        sent = self._published.setdefault(card, set())
        sent.intersection_update(e.msg_id for e in doc.outbox)  # the stripped are forgotten
        for entry in doc.outbox:
            if entry.msg_id in sent:
                continue
            try:
                await publish(self.bucket.js, parts_subject(self.node, card), entry.event,
                              msg_id=entry.msg_id, timeout=PUBLISH_SECONDS)
            except Exception as exc:
                log.warning("audit entry %s of card %d kept in the claims document, to be sent "
                            "again: %s", entry.msg_id, card, exc or type(exc).__name__,
                            extra={"card": card, "claim_id": entry.event.claim_id,
                                   "pod_uid": entry.event.pod_uid})
                return
            sent.add(entry.msg_id)

    async def flush_outbox(self) -> int:
        """Send what the documents still hold (an earlier write's failed publish, a process that
        died between a write and its publish) and strip what is sent. Returns the entries left;
        raises StoreReadError when the documents cannot be read."""
        left = 0
        for card, (doc, _) in (await self.read_all()).items():
            if not doc.outbox:
                continue
            async with self._order.setdefault(card, asyncio.Lock()):
                await self._send(card, doc)
            sent = frozenset(self._published.get(card, ()))
            if sent:
                try:
                    doc, _ = await self.update(card, functools.partial(outbox.strip,
                                                                       published=sent))
                except Exception as exc:
                    log.warning("could not strip the sent audit entries of card %d (sent again "
                                "later, de-duplicated): %s", card, exc, extra={"card": card})
            left += sum(1 for e in doc.outbox if e.msg_id not in sent)
        return left
