"""The allocator's view of its node's Pods: a mirror of the watcher's `pk-pods` bucket.

Chosen over a consumer of PK_PODS because the allocator needs the current state of each Pod, not
the history of how it got there: a KV watch (bus/kv.py `watch`, an ephemeral ordered consumer of
this node's keys only) replays the latest record of every key of this node and then follows
changes, so a restarted allocator starts with a complete view and nothing has to be acknowledged.
The view is "loaded" when the watch says the records present at its start have all come (the
server's pending counts, not nats-py's end-of-replay marker); a consumer reset inside the watch
resumes after the last record seen, so neither the replay nor the view starts over. Only the
watcher writes records; a Pod we have no record of is `None` (unknown), never dead: death is an
event, never an absence.

What the allocator decides from the view is only whether a Pod is dead (the snapshot's dead set;
a retried Allocate's holder), so the view wakes the recompute (`on_change`) only when a Pod's
record changes that: a new pending Pod, or one going from Pending to Running, changes no list
kubelet reads, and a pass for it would only compete with the Allocate that follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nats.aio.client import Client
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from partkeeper import backoff
from partkeeper.bus import kv
from partkeeper.podstate import is_dead
from schemas import PodRecord, SchemaError, decode
from schemas.names import BUCKET_PODS, decode_token, encode_token
from schemas.pods import PodState

log = logging.getLogger(__name__)


class PodView:
    def __init__(self, nc: Client, node: str, on_change: Callable[[], None]) -> None:
        self.nc = nc
        self.node = node
        self.prefix = f"{encode_token(node)}."
        self.on_change = on_change
        self.records: dict[str, PodRecord] = {}
        self.skipped = 0  # undecodable records (left out, counted)

    def state(self, uid: str) -> PodState | None:
        record = self.records.get(uid)
        return record.state if record is not None else None

    def dead(self, uid: str) -> bool:
        return is_dead(self.state(uid))

    def record(self, uid: str) -> PodRecord | None:
        return self.records.get(uid)

    async def run(self, loaded: asyncio.Event) -> None:
        """Follow the bucket until cancelled; `loaded` is set once the first replay is complete."""
        await backoff.keep_following("watching pk-pods", lambda: self._follow(loaded))

    async def _follow(self, loaded: asyncio.Event) -> None:
        replay: dict[str, PodRecord] | None = {}
        watch = kv.watch(self.nc, BUCKET_PODS, f"{self.prefix}*", label="allocator-pods")
        async with contextlib.aclosing(watch) as entries:
            async for entry in entries:
                if entry is None:  # the records present at the start have come: swap them in
                    if replay is not None:
                        self.records, replay = replay, None
                        loaded.set()
                        self.on_change()
                    continue
                target = replay if replay is not None else self.records
                if self._apply(target, entry) and replay is None:
                    self.on_change()

    def _apply(self, target: dict[str, PodRecord], entry: KeyValue.Entry) -> bool:
        """Apply one entry to `target`; True when it changed whether that Pod is dead."""
        try:
            uid = decode_token(entry.key[len(self.prefix) :])
        except ValueError:
            self.skipped += 1
            log.warning("pk-pods key %s is not <node>.<uid>; ignored", entry.key)
            return False
        before = target.get(uid)
        was_dead = before is not None and is_dead(before.state)
        if entry.operation in (KV_DEL, KV_PURGE):
            target.pop(uid, None)  # the record expired: unknown again, not dead
            return was_dead
        try:
            record = decode(entry.value or b"", PodRecord, what=f"pod record {entry.key}")
        except SchemaError as exc:
            self.skipped += 1
            log.warning("%s; the previous view of Pod %s is kept", exc, uid)
            return False
        if record.uid != uid or record.node != self.node:
            self.skipped += 1
            log.warning("pod record %s names Pod %s on %s; ignored", entry.key, record.uid,
                        record.node)
            return False
        target[uid] = record
        return is_dead(record.state) != was_dead
