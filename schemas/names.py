"""Subjects, streams, consumers and buckets, built by functions; configurations as data.

Node names and card ids become subject tokens and KV keys through a reversible, collision-free
encoding: ASCII letters, digits and '-' stand for themselves; every other byte of the UTF-8 form,
'_' included, becomes '_' followed by two lowercase hex digits. Because '_' never stands for
itself, decoding is unambiguous and two different names never share a token.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

_PLAIN = frozenset(string.ascii_letters + string.digits + "-")

STREAM_PODS = "PK_PODS"
STREAM_PARTITIONS = "PK_PARTITIONS"
STREAM_DLQ = "PK_DLQ"

BUCKET_CLAIMS = "pk-claims"
BUCKET_PODS = "pk-pods"
BUCKET_CAPACITY = "pk-capacity"

SERVICE_ALLOCATOR = "pk-allocator"
SERVICE_WATCHER = "pk-watcher"
SERVICE_RECLAIMER = "pk-reclaimer"

# Partition-stream token for events that belong to the node rather than to one card: the
# allocator's (AllocateRefused). The GC announces collected working directories under its own
# token, so the watcher can tell who said what and the GC cannot speak for the allocator. Card
# tokens are the decimal index, so neither collides with a card.
NODE_SCOPE = "node"
GC_SCOPE = "gc"


class TokenError(ValueError):
    """A token could not be encoded or decoded."""


def encode_token(value: str) -> str:
    if not value:
        raise TokenError("an empty name cannot be a subject token")
    out: list[str] = []
    for ch in value:
        if ch in _PLAIN:
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode_token(token: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "_":
            pair = token[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in "0123456789abcdef" for c in pair):
                raise TokenError(f"bad escape at {i} in token {token!r}")
            raw.append(int(pair, 16))
            i += 3
        elif ch in _PLAIN:
            raw.extend(ch.encode())
            i += 1
        else:
            raise TokenError(f"character {ch!r} cannot appear in an encoded token {token!r}")
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenError(f"token {token!r} does not decode to UTF-8") from exc
    if not value or encode_token(value) != token:
        raise TokenError(f"token {token!r} is not in canonical form")
    return value


def card_token(card: int | str) -> str:
    return encode_token(str(card))


# --- subjects -----------------------------------------------------------------------------------


def pods_subject(node: str, uid: str) -> str:
    return f"pk.pods.{encode_token(node)}.{encode_token(uid)}"


def pods_filter(node: str) -> str:
    return f"pk.pods.{encode_token(node)}.*"


def parts_subject(node: str, card: int | None) -> str:
    scope = NODE_SCOPE if card is None else card_token(card)
    return f"pk.parts.{encode_token(node)}.{scope}"


def gc_parts_subject(node: str) -> str:
    """The GC's audit subject (WorkdirCollected)."""
    return f"pk.parts.{encode_token(node)}.{GC_SCOPE}"


def parts_filter(node: str) -> str:
    return f"pk.parts.{encode_token(node)}.*"


def dlq_subject(node: str, service: str) -> str:
    return f"pk.dlq.{encode_token(node)}.{encode_token(service)}"


def claims_query_subject(node: str) -> str:
    return f"pk.{encode_token(node)}.claims.query"


def pods_get_subject(node: str) -> str:
    return f"pk.{encode_token(node)}.pods.get"


def pods_states_subject(node: str) -> str:
    return f"pk.{encode_token(node)}.pods.states"


def pods_pending_subject(node: str) -> str:
    return f"pk.{encode_token(node)}.pods.pending"


def reclaim_now_subject(node: str) -> str:
    return f"pk.{encode_token(node)}.reclaim.now"


# --- durable consumers and KV keys --------------------------------------------------------------


# The services that hold durable consumers, as their durable names begin (the node check at
# start builds the longest name from them).
DURABLE_SERVICES = ("watcher-events", "reclaimer", "gc")


def durable_name(service: str, node: str, stream: str = STREAM_PODS) -> str:
    """One durable per (service, node, stream); durable names allow '_' and '-' but not '.'."""
    return f"{service}-{stream.lower()}-{encode_token(node)}"


def claims_key(node: str, card: int) -> str:
    return f"{encode_token(node)}.{card_token(card)}"


def claims_prefix(node: str) -> str:
    return f"{encode_token(node)}."


def pods_key(node: str, uid: str) -> str:
    return f"{encode_token(node)}.{encode_token(uid)}"


def capacity_key(node: str) -> str:
    return encode_token(node)


# --- configurations as data ---------------------------------------------------------------------


# The largest message any stream or bucket takes (its `max_msg_size`, a bucket's value size):
# the largest we write is a Pod record or a PodSeen of a Pod with many containers, a few KiB;
# the room above is for Pods with hundreds of containers (docs/operations.md, "Sizing").
MAX_MSG_BYTES = 256 * 1024
# What all streams and buckets together may hold by default (`PK_STORE_BYTES`), shared out by
# each spec's `share` (permille); docs/operations.md, "Sizing", states the fleet it serves.
STORE_BYTES = 2 * 1024**3


def share_of(store_bytes: int, permille: int) -> int:
    return store_bytes * permille // 1000


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_seconds: float
    duplicate_window_seconds: float = 120.0
    share: int = 0  # permille of the store bytes


@dataclass(frozen=True, slots=True)
class BucketSpec:
    name: str
    history: int
    description: str
    share: int = 0  # permille of the store bytes


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    ack_wait_seconds: float = 30.0
    max_deliver: int = 10
    # One replica, file storage, on streams of 3: a fleet's durables are three per node, and one
    # raft group each (the stream's replicas) cost a 3-server cluster its CPU from 200 nodes on
    # (docs/benchmarks.md, the fleet). The messages stay replicated in the stream; a consumer
    # whose server is down waits for it, and one lost with its disk is re-created and replays.
    replicas: int = 1


DAY = 86_400.0

STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(STREAM_PODS, ("pk.pods.>",), max_age_seconds=7 * DAY, share=400),
    # The claims outbox re-sends a transition whose publish may have landed (claims/outbox.py):
    # a re-send within this window is dropped, so it covers a bus outage that long.
    StreamSpec(STREAM_PARTITIONS, ("pk.parts.>",), max_age_seconds=30 * DAY,
               duplicate_window_seconds=15 * 60.0, share=250),
    StreamSpec(STREAM_DLQ, ("pk.dlq.>",), max_age_seconds=30 * DAY, share=50),
)

BUCKETS: tuple[BucketSpec, ...] = (
    BucketSpec(BUCKET_CLAIMS, history=5, description="claims per card: <node>.<card>",
               share=150),
    BucketSpec(BUCKET_PODS, history=1, description="watcher's Pod view: <node>.<uid>",
               share=120),
    BucketSpec(BUCKET_CAPACITY, history=1, description="allocator's capacity per node",
               share=30),
)

CONSUMER = ConsumerSpec()
