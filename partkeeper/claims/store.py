"""The claims store on the pk-claims KV bucket: one document per card, every change a CAS.

`update(card, mutate)` is the one writer: read the document and its revision, apply a pure
mutation, write with "expected last revision", retry on a conflict. Nothing else calls put. The
revision fences the allocator and the reclaimer of a card across processes without a shared lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from partkeeper.bus import backoff
from partkeeper.bus.kv import Bucket, entries
from partkeeper.claims import machine
from schemas import CardClaims, SchemaError, decode, encode
from schemas.names import claims_key, claims_prefix, decode_token

log = logging.getLogger(__name__)

Mutation = Callable[[CardClaims], CardClaims]


class StoreReadError(Exception):
    """The claims could not be read (store unreachable, undecodable document). Fail closed."""


class ConflictExhausted(Exception):
    """Too many concurrent writers in a row; the caller should retry later."""


class ClaimsStore:
    def __init__(self, bucket: Bucket, node: str, *, max_conflicts: int = 64) -> None:
        self.bucket = bucket
        self.kv = bucket.kv
        self.node = node
        self.max_conflicts = max_conflicts
        self.conflicts = 0  # CAS conflicts seen, for metrics and tests

    async def read(self, card: int) -> tuple[CardClaims, int]:
        """The card's document and its revision (0: no document yet). Raises StoreReadError."""
        key = claims_key(self.node, card)
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return machine.empty(self.node, card), 0
        except Exception as exc:
            raise StoreReadError(f"reading claims of card {card} failed: {exc}") from exc
        try:
            doc = decode(entry.value or b"", CardClaims, what=f"claims document {key}")
        except SchemaError as exc:
            raise StoreReadError(str(exc)) from exc
        if doc.card != card or doc.node != self.node:
            raise StoreReadError(f"claims document {key} names node {doc.node} card {doc.card}")
        return doc, int(entry.revision or 0)

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
        self, card: int, mutate: Mutation, *, known: tuple[CardClaims, int] | None = None
    ) -> tuple[CardClaims, int]:
        """Apply `mutate` with compare-and-set; returns the written document and revision.

        `mutate` may raise TransitionError to refuse; nothing is written then. Returning the
        same object means "no change" and writes nothing.

        `known`: the document and revision the caller read or wrote a moment ago. The first
        attempt writes against it without reading; the revision makes that safe (a stale one is
        refused by the server). Only a write is taken from it: a mutation that changes nothing
        or refuses on it is judged again on a fresh read, so the outcome is the one without it.
        """
        key = claims_key(self.node, card)
        if known is not None:
            done = await self._write_on(key, mutate, *known)
            if done is not None:
                return done
        for attempt in range(1, self.max_conflicts + 1):
            doc, revision = await self.read(card)
            new = mutate(doc)
            if new is doc:
                return doc, revision
            try:
                if revision == 0:
                    written = await self.kv.create(key, encode(new))
                else:
                    written = await self.kv.update(key, encode(new), last=revision)
            except KeyWrongLastSequenceError:
                self.conflicts += 1
                await asyncio.sleep(backoff.delay(attempt, base=0.002, cap=0.05))
                continue
            return new, int(written)
        raise ConflictExhausted(f"claims of card {card}: {self.max_conflicts} conflicts in a row")

    async def _write_on(
        self, key: str, mutate: Mutation, doc: CardClaims, revision: int
    ) -> tuple[CardClaims, int] | None:
        """`mutate(doc)` written against `revision`; None when it changed nothing, refused, or
        the revision is no longer the latest (the caller reads afresh)."""
        try:
            new = mutate(doc)
        except Exception:
            return None
        if new is doc:
            return None
        try:
            if revision == 0:
                written = await self.kv.create(key, encode(new))
            else:
                written = await self.kv.update(key, encode(new), last=revision)
        except KeyWrongLastSequenceError:
            return None
        return new, int(written)
