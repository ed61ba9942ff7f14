"""A seeded attacker holding one node's service credentials, and what it must not achieve.

Model: the four real services of node `NODE` run on a real nats-server with the shipped
permissions (compose/nats/nats.conf); another node's records (`OTHER`) lie beside them. For each
service user the attacker publishes and requests on every subject that user's role may publish
(bus/permissions.py, wildcards filled from a pool of tokens), with headers nats-server interprets,
reply subjects drawn from every stream's and bucket's subjects and the inboxes, and bodies from
the fuzz corpus (bench.fuzz's generator, deep nesting, near-limit sizes). Afterwards
(`Before.check`):

- no key of `OTHER` and no message on its subjects changed, no stream or bucket lost a message
  to a purge or rollup;
- every key of `NODE` still reads as its bucket's document of this node: a key changed by
  anything but its owner's code (a `ClaimsReply` written into a claim key by a responder, a
  rollup's marker) does not;
- the attacker writes its own role's keys of this node only with a rollup or purge header,
  which the server must refuse (with them allowed, one such message empties the bucket of
  every node's keys); other writes there are the owner's credentials corrupting the owner's
  own data, no reach beyond the node (docs/security.md), so the Pod lifecycle run after the
  attack must pass.

Reply subjects from every stream's and bucket's subjects go with requests to our services
(`pk.<node>.<verb>`) and plain subjects; what the server itself answers (the JetStream API,
acks, and any publish onto a stream subject, answered with a PubAck) carries the attacker's own
inbox. The server writes those answers to whatever reply subject the message names, into
another node's stream or key when it is one, and no NATS permission restrains reply subjects:
a known limit of one shared account (docs/security.md, "What the server still writes for a
node"; test_one_node_reach.py holds it, and what the victim does with it: fail closed), not
something the attacker needs to find again on every seed.

The server's answers are not asserted message by message: refusals arrive as asynchronous
permission errors and JetStream errors, and what matters is the state afterwards.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError

from bench.fuzz import Gen
from partkeeper.bus.permissions import ADMIN, BY_NAME, inbox_prefix
from schemas import (
    CardClaims,
    ClaimsQuery,
    NodeCapacity,
    PodGone,
    PodRecord,
    PodsGet,
    ReclaimNow,
    decode,
    encode,
)
from schemas.names import (
    BUCKET_CAPACITY,
    BUCKET_CLAIMS,
    BUCKET_PODS,
    MAX_MSG_BYTES,
    STREAM_DLQ,
    STREAM_PARTITIONS,
    STREAM_PODS,
)

NODE, OTHER = "sim-node-0", "sim-node-1"
SERVICES = ("watcher", "allocator", "reclaimer", "gc")
OTHER_UID = "7d1a2b3c-4d5e-4f60-8a7b-9c0d1e2f3a4b"  # a Pod of the other node
# Tokens for wildcards: cards of neither node's live state ("7"), the other node's Pod, names of
# other scopes, and tokens that look like other subjects' pieces.
TOKENS = ("7", "9", "x", "gc", "node", OTHER_UID, OTHER, NODE, "pk-claims", "$KV", "_INBOX",
          "w1", "reclaimer-pk_pods-sim-node-0", "PK_PODS")
# This node's keys holding live state: never a target of the attacker's own-key writes.
LIVE_TOKENS = ("0", "1", "2")


def other_keys() -> dict[str, str]:
    """bucket -> the other node's key in it."""
    return {BUCKET_CLAIMS: f"{OTHER}.0", BUCKET_PODS: f"{OTHER}.{OTHER_UID}",
            BUCKET_CAPACITY: OTHER}


def other_subjects() -> list[str]:
    return [f"pk.pods.{OTHER}.{OTHER_UID}", f"pk.parts.{OTHER}.0", f"pk.parts.{OTHER}.node",
            f"pk.dlq.{OTHER}.reclaimer"]


def reply_subjects() -> list[str]:
    """Every stream's and bucket's subjects of both nodes, the inboxes, and no reply."""
    out: list[str] = []
    for node in (NODE, OTHER):
        out += [f"$KV.{BUCKET_CLAIMS}.{node}.0", f"$KV.{BUCKET_CLAIMS}.{node}.7",
                f"$KV.{BUCKET_PODS}.{node}.{OTHER_UID}", f"$KV.{BUCKET_CAPACITY}.{node}",
                f"pk.pods.{node}.{OTHER_UID}", f"pk.parts.{node}.0", f"pk.parts.{node}.node",
                f"pk.parts.{node}.gc", f"pk.dlq.{node}.watcher-events"]
    out += [f"{inbox_prefix(s, NODE)}.x{i}" for i, s in enumerate((*SERVICES, ADMIN))]
    out += ["$JS.API.STREAM.PURGE.KV_pk-claims", "$JS.API.STREAM.DELETE.PK_PODS"]
    return out


HEADER_CHOICES: tuple[Callable[[random.Random], dict[str, str]], ...] = (
    lambda r: {"Nats-Rollup": r.choice(["all", "sub"])},
    lambda r: {"Nats-Rollup": "all", "KV-Operation": "PURGE"},
    lambda r: {"KV-Operation": r.choice(["PURGE", "DEL"])},
    lambda r: {"Nats-Msg-Id": r.choice([f"{OTHER}/PodGone/{OTHER_UID}", f"PodGone/{OTHER_UID}",
                                        f"dlq/PK_PODS/reclaimer-pk_pods-{OTHER}/1",
                                        uuid.uuid4().hex])},
    lambda r: {"Nats-Expected-Stream": r.choice(["KV_pk-claims", "PK_PODS", "nope"])},
    lambda r: {"Nats-Expected-Last-Sequence": r.choice(["0", "1", "999999"])},
    lambda r: {"Nats-Expected-Last-Subject-Sequence": r.choice(["0", "1"])},
    lambda r: {"Nats-Expected-Last-Msg-Id": "x"},
    lambda r: {"Nats-TTL": r.choice(["1s", "1", "never", "-1"])},
    lambda r: {"Nats-Marker-Reason": r.choice(["MaxAge", "Purge", "Remove"])},
    lambda r: {"Nats-Required-Api-Level": "99"},
    lambda r: {"Nats-Batch-Id": "b1", "Nats-Batch-Sequence": "1", "Nats-Batch-Commit": "1"},
    lambda r: {"Nats-Incr": "+1"},
    lambda r: {"Nats-Schedule": "@every 1s", "Nats-Schedule-Target": f"pk.pods.{OTHER}.x"},
)


ROLLUPS = HEADER_CHOICES[:2]


@dataclass
class Tally:
    sent: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


class Attacker:
    """One service user's seeded stream of publishes and requests."""

    def __init__(self, service: str, seed: int) -> None:
        self.service = service
        self.r = random.Random(f"{seed}/{service}")
        self.gen = Gen(self.r.randrange(2**32))
        role = BY_NAME[service].render(NODE)
        denied = set(role.deny_publish)
        self.subjects = [s for s in role.publish if s not in denied]
        self.replies = reply_subjects()
        self.inbox = f"{inbox_prefix(service, NODE)}.attack"

    def subject(self) -> str:
        pattern = self.r.choice(self.subjects)
        out: list[str] = []
        for token in pattern.split("."):
            if token == "*":
                out.append(self.r.choice(TOKENS))
            elif token == ">":
                out += [self.r.choice(TOKENS) for _ in range(self.r.randint(1, 2))]
            else:
                out.append(token)
        return ".".join(out)

    def reply(self, subject: str) -> str:
        if self.r.random() < 0.5:
            return ""
        if subject.startswith(("$JS.", "$KV.", "pk.pods.", "pk.parts.", "pk.dlq.")):
            return self.inbox  # the server's own answers: see the module's docstring
        return self.r.choice(self.replies)

    def headers(self) -> dict[str, str] | None:
        if self.r.random() < 0.3:
            return None
        headers: dict[str, str] = {}
        for choice in self.r.sample(HEADER_CHOICES, self.r.randint(1, 3)):
            headers.update(choice(self.r))
        return headers

    def body(self, subject: str) -> bytes:
        pick = self.r.randint(0, 9)
        if pick == 0:
            depth = self.r.choice([40, 3000, 20000])
            return b'{"v":1,"x":' + b"[" * depth + b"]" * depth + b"}"
        if pick == 1:
            size = self.r.choice([MAX_MSG_BYTES - 200, MAX_MSG_BYTES - 5000, MAX_MSG_BYTES + 10])
            return b'{"v":1,"type":"PodGone","pad":"' + b"x" * size + b'"}'
        if pick == 2:
            return self._valid(subject)
        if pick == 3 and subject.startswith("$JS.API.CONSUMER.CREATE."):
            # a push consumer delivering into another stream (the server refuses it)
            stream = subject.split(".")[4]
            return json.dumps({"stream_name": stream, "config": {
                "deliver_subject": self.r.choice(self.replies), "ack_policy": "none",
                "filter_subject": ".".join(subject.split(".")[6:])}}).encode()
        kind = self.r.choice([PodGone, PodRecord, CardClaims, NodeCapacity, PodsGet,
                              ClaimsQuery, ReclaimNow])
        return self.gen.bad_body(kind)

    def _valid(self, subject: str) -> bytes:
        node = self.r.choice([NODE, OTHER])
        if subject.endswith("pods.get"):
            return encode(PodsGet(uid=OTHER_UID))
        if subject.endswith("claims.query"):
            return encode(ClaimsQuery())
        if subject.endswith("reclaim.now"):
            return encode(ReclaimNow(claim_ids=["c1"]))
        if subject.startswith("pk.pods."):
            return encode(PodGone(node=node, uid=OTHER_UID, namespace="ns", name="p",
                                  resource_version="9", observed_at=1.0, evidence="deleted"))
        return encode(self.gen.struct(self.r.choice([CardClaims, PodRecord, NodeCapacity])))

    async def run(self, nc: Client, count: int, tally: Tally) -> None:
        for i in range(count):
            subject = self.subject()
            reply = self.reply(subject)
            headers = self.headers()
            if subject.startswith("$KV."):  # its own keys: only what the server must refuse
                headers = {**(headers or {}), **self.r.choice(ROLLUPS)(self.r)}
            try:
                await nc.publish(subject, self.body(subject), reply=reply, headers=headers)
            except nats.errors.Error as exc:  # a body past the server's max_payload
                tally.errors[type(exc).__name__] += 1
                continue
            tally.sent[self.service] += 1
            if i % 200 == 199:
                await nc.flush(timeout=10)
        await nc.flush(timeout=10)


async def connect_as(url: str, service: str, tally: Tally) -> Client:
    async def on_error(exc: Exception) -> None:
        tally.errors["async"] += 1

    return await nats.connect(url, user=f"pk-{service}", password=f"pk-{service}-dev",
                              inbox_prefix=inbox_prefix(service, NODE), error_cb=on_error,
                              allow_reconnect=False, max_reconnect_attempts=0)


async def seed_other_node(js: JetStreamContext) -> None:
    """The other node's claim document, Pod record, capacity and stream messages (as admin)."""
    for bucket, key in other_keys().items():
        kv = await js.key_value(bucket)
        await kv.put(key, json.dumps({"v": 1, "node": OTHER, "bucket": bucket}).encode())
    for subject in other_subjects():
        stream = {"pods": STREAM_PODS, "parts": STREAM_PARTITIONS, "dlq": STREAM_DLQ}[
            subject.split(".")[1]]
        await js.publish(subject, b'{"v":1,"node":"' + OTHER.encode() + b'"}', stream=stream,
                         headers={"Nats-Msg-Id": f"seed/{subject}"})


@dataclass
class Before:
    """What the attack must leave as it was."""

    keys: dict[str, tuple[int, bytes]]
    subjects: dict[str, tuple[int, int]]  # subject -> (count, last sequence)

    @classmethod
    async def take(cls, js: JetStreamContext) -> Before:
        keys = {}
        for bucket, key in other_keys().items():
            entry = await (await js.key_value(bucket)).get(key)
            keys[f"{bucket}/{key}"] = (entry.revision or 0, entry.value or b"")
        subjects = {s: await _subject_state(js, s) for s in other_subjects()}
        return cls(keys, subjects)

    async def check(self, js: JetStreamContext) -> list[str]:
        """What changed that must not have; empty when nothing did."""
        after = await Before.take(js)
        problems = [f"{k}: {self.keys[k]} -> {v}" for k, v in after.keys.items()
                    if v != self.keys[k]]
        problems += [f"{s}: {self.subjects[s]} -> {v}" for s, v in after.subjects.items()
                     if v != self.subjects[s]]
        problems += await own_keys_problems(js)
        return problems


async def _subject_state(js: JetStreamContext, subject: str) -> tuple[int, int]:
    stream = {"pods": STREAM_PODS, "parts": STREAM_PARTITIONS, "dlq": STREAM_DLQ}[
        subject.split(".")[1]]
    info = await js.stream_info(stream, subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    try:
        last = (await js.get_last_msg(stream, subject)).seq or 0
    except NotFoundError:
        last = 0
    return count, last


DOCUMENTS: dict[str, Any] = {BUCKET_CLAIMS: CardClaims, BUCKET_PODS: PodRecord,
                             BUCKET_CAPACITY: NodeCapacity}


def _live(bucket: str, key: str) -> bool:
    """A key of this node holding live state: a card's claims, a real Pod's record, the
    capacity (keys under the attacker's pool of tokens are its own writes)."""
    parts = key.split(".")
    if parts[0] != NODE:
        return False
    if bucket == BUCKET_CLAIMS:
        return len(parts) == 2 and parts[1] in LIVE_TOKENS
    if bucket == BUCKET_PODS:
        return len(parts) == 2 and parts[1] not in TOKENS
    return key == NODE


async def own_keys_problems(js: JetStreamContext) -> list[str]:
    """This node's live keys that no longer read as their bucket's document of this node."""
    problems: list[str] = []
    for bucket, kind in DOCUMENTS.items():
        kv = await js.key_value(bucket)
        try:
            keys = await kv.keys()
        except Exception:  # nats-py's NoKeysError: the bucket holds none
            keys = []
        for key in (k for k in keys if _live(bucket, k)):
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                continue
            try:
                doc = decode(entry.value or b"", kind, what=f"{bucket} {key}")
            except Exception as exc:
                problems.append(f"{bucket} {key}: {exc}")
                continue
            if getattr(doc, "node", NODE) != NODE:
                problems.append(f"{bucket} {key}: names node {doc.node}")
    return problems


async def attack_all(url: str, count: int, seed: int) -> Tally:
    """Every service user in turn, `count` messages each."""
    tally = Tally()
    for service in SERVICES:
        nc = await connect_as(url, service, tally)
        try:
            await Attacker(service, seed).run(nc, count, tally)
        finally:
            await nc.close()
        await asyncio.sleep(0)
    return tally


__all__ = ["NODE", "OTHER", "Attacker", "Before", "Tally", "attack_all", "seed_other_node"]
