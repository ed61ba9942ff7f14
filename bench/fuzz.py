"""Fuzzing at volume: generated inputs across the decoders, the subject-token parser and the
request bodies of the micro endpoints, with zero crashes and zero state changes from bad input.

    python -m bench.fuzz [--inputs 100000] [--network 2000] [--seed 1]

Goal (invariant 10, issue 24): at least 100,000 inputs in one run; a crash (any exception but the
contract's SchemaError / TokenError) or a handler reached by a body that does not decode fails it.

- decoders: every contract kind (events, documents, requests, replies) gets random bytes, random
  JSON, objects with a right or near-miss `v` and tag, valid documents with one field replaced
  and valid documents truncated; each must decode to the kind asked for or raise SchemaError,
  and a valid one must round-trip unchanged.
- subject tokens: `decode_token` (how KV keys and subjects are read back: Pod UIDs, card ids)
  on random strings and near-canonical escapes: a value that re-encodes to the token, or
  TokenError; `encode_token` round-trips every string.
- request bodies: `--network` of them are sent to real micro endpoints (`bus.serve`, the code every
  service answers with) on a real nats-server; every body that does not decode must be answered
  with the 400 error body and reach no handler (the handlers are where state changes); the rest
  of the request share is decoded in-process by the same `decode_request`.

CI runs a small share (tests/reliability/test_fuzz_bench.py); the hypothesis tests in
test_fuzz_decoders.py keep shrinking failures to a minimal example.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import time
import types
import typing
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats

from schemas import (
    CardClaims,
    ClaimsQuery,
    ClaimsReply,
    NodeCapacity,
    PartitionEvent,
    PendingPodsQuery,
    PendingPodsReply,
    PodEvent,
    PodRecord,
    PodsGet,
    PodsGetReply,
    ReclaimNow,
    ReclaimNowReply,
    SchemaError,
    decode,
    decode_request,
    encode,
)
from schemas.events import (
    AllocateRefused,
    ClaimChanged,
    DestroyFailed,
    ForeignFound,
    ForeignGone,
    PodFinished,
    PodGone,
    PodSeen,
    WorkdirCollected,
)
from schemas.names import TokenError, decode_token, encode_token

GOAL = 100_000
KINDS: dict[str, Any] = {
    "PodEvent": PodEvent, "PartitionEvent": PartitionEvent, "CardClaims": CardClaims,
    "PodRecord": PodRecord, "NodeCapacity": NodeCapacity, "PodsGet": PodsGet,
    "PodsGetReply": PodsGetReply, "PendingPodsQuery": PendingPodsQuery,
    "PendingPodsReply": PendingPodsReply, "ClaimsQuery": ClaimsQuery, "ClaimsReply": ClaimsReply,
    "ReclaimNow": ReclaimNow, "ReclaimNowReply": ReclaimNowReply,
}
UNION_OF: dict[type, Any] = {
    **dict.fromkeys((PodSeen, PodFinished, PodGone), PodEvent),
    **dict.fromkeys((ClaimChanged, DestroyFailed, ForeignFound, ForeignGone, WorkdirCollected,
                     AllocateRefused), PartitionEvent)}
STRUCTS: tuple[type, ...] = (*UNION_OF, CardClaims, PodRecord, NodeCapacity, PodsGet,
                             PodsGetReply, PendingPodsQuery, PendingPodsReply, ClaimsQuery,
                             ClaimsReply, ReclaimNow, ReclaimNowReply)
REQUESTS: tuple[type, ...] = (PodsGet, PendingPodsQuery, ClaimsQuery, ReclaimNow)
TAGS = ["PodSeen", "PodFinished", "PodGone", "ClaimChanged", "CardClaims", "PodRecord",
        "NodeCapacity", "PodsGet", "ClaimsQuery", "ReclaimNow", "PendingPodsQuery", "Nope", ""]
TEXT = "abcXYZ019-_./ \"\\{}[]:,é中\x00\n" + "".join(chr(c) for c in (0x7f, 0xd7ff, 0x10ffff))


@dataclass
class Tally:
    inputs: Counter[str] = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)
    state_changes: int = 0
    refused: int = 0  # network bodies that did not decode, each answered 400

    def crash(self, where: str, data: object, exc: BaseException) -> None:
        if len(self.crashes) < 20:
            self.crashes.append(f"{where}: {type(exc).__name__}: {exc} on {data!r:.120}")


class Gen:
    """Random values, JSON and contract structs (msgspec's limits: 64-bit ints, finite floats)."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def text(self, most: int = 16) -> str:
        return "".join(self.r.choice(TEXT) for _ in range(self.r.randint(0, most)))

    def json_value(self, depth: int = 0) -> Any:
        pick = self.r.randint(0, 7 if depth < 3 else 4)
        if pick == 0:
            return None
        if pick == 1:
            return self.r.random() < 0.5
        if pick == 2:
            return self.r.choice([0, 1, -1, 2**63, 2**64, -(2**70), self.r.randint(-9, 10**6)])
        if pick == 3:
            return self.r.choice([0.5, -1e308, 1e-310, self.r.uniform(-1e6, 1e6)])
        if pick == 4:
            return self.text()
        if pick in (5, 6):
            return [self.json_value(depth + 1) for _ in range(self.r.randint(0, 4))]
        return {self.text(8): self.json_value(depth + 1) for _ in range(self.r.randint(0, 5))}

    def envelope(self) -> dict[str, Any]:
        body = {self.text(10): self.json_value(1) for _ in range(self.r.randint(0, 6))}
        body["v"] = self.r.choice([1, 0, 2, -1, "1", 1.0, True, None])
        body["type"] = self.r.choice(TAGS)
        return body

    def value_of(self, tp: Any) -> Any:
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            return self.struct(tp)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is list:
            return [self.value_of(args[0]) for _ in range(self.r.randint(0, 2))]
        if origin is dict:
            return {self.value_of(args[0]): self.value_of(args[1])
                    for _ in range(self.r.randint(0, 2))}
        if origin in (typing.Union, types.UnionType):
            return self.value_of(self.r.choice(args))
        if origin is typing.Literal:
            return self.r.choice(args)
        simple = {str: lambda: self.text(20), bool: lambda: self.r.random() < 0.5,
                  type(None): lambda: None, int: lambda: self.r.randint(-(2**63), 2**64 - 1),
                  float: lambda: self.r.uniform(-1e9, 1e9)}
        return simple[tp]()

    def struct(self, cls: type) -> Any:
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: self.value_of(hints[f.name]) for f in msgspec.structs.fields(cls)
                      if f.name != "v"})

    def bad_body(self, cls: type) -> bytes:
        """Bytes for a request of `cls`: mostly broken, some valid by chance."""
        pick = self.r.randint(0, 4)
        if pick == 0:
            return self.r.randbytes(self.r.randint(0, 64))
        if pick == 1:
            return json.dumps(self.json_value()).encode()
        if pick == 2:
            return json.dumps(self.envelope()).encode()
        doc = msgspec.json.decode(encode(self.struct(cls)))
        if pick == 3 and doc:
            doc[self.r.choice(sorted(doc))] = self.json_value(1)
            return json.dumps(doc).encode()
        wire = json.dumps(doc).encode()
        return wire[: self.r.randint(0, len(wire))]


def _decodes(data: bytes | str, kind: Any, tally: Tally, where: str) -> None:
    tally.inputs[where] += 1
    try:
        decode(data, kind)
    except SchemaError:
        pass
    except Exception as exc:
        tally.crash(where, data, exc)


def fuzz_decoders(gen: Gen, count: int, tally: Tally) -> None:
    kinds = list(KINDS.values())
    while sum(tally.inputs[k] for k in ("bytes", "json", "mutated", "truncated")) < count:
        kind = gen.r.choice(kinds)
        _decodes(gen.r.randbytes(gen.r.randint(0, 200)), kind, tally, "bytes")
        value = gen.json_value() if gen.r.random() < 0.5 else gen.envelope()
        _decodes(json.dumps(value), kind, tally, "json")
        struct = gen.r.choice(STRUCTS)
        valid = gen.struct(struct)
        wire = encode(valid)
        target = UNION_OF.get(struct, struct)
        try:
            if decode(wire, target) != valid:
                tally.crash("round trip", wire, AssertionError("decoded value differs"))
        except Exception as exc:
            tally.crash("round trip", wire, exc)
        doc = msgspec.json.decode(wire)
        doc[gen.r.choice(sorted(doc))] = gen.json_value(1)
        _decodes(json.dumps(doc), target, tally, "mutated")
        _decodes(wire[: gen.r.randint(0, len(wire))], target, tally, "truncated")


def fuzz_tokens(gen: Gen, count: int, tally: Tally) -> None:
    escapes = ["_2e", "_5f", "_", "_g1", "_2E", "_e4_b8_ad", "_ff", "_c3", "-", ".", "a"]
    for _ in range(count):
        if gen.r.random() < 0.5:
            token = gen.text(12)
        else:
            token = "".join(gen.r.choice(escapes) for _ in range(gen.r.randint(0, 6)))
        tally.inputs["tokens"] += 1
        try:
            value = decode_token(token)
            if encode_token(value) != token:
                tally.crash("token", token, AssertionError(f"decoded to {value!r}, not canonical"))
            int(value) if value.isdecimal() else None  # how a card id is read back
        except (TokenError, ValueError):
            pass
        except Exception as exc:
            tally.crash("token", token, exc)
        name = gen.text(12) or "x"
        try:
            if decode_token(encode_token(name)) != name:
                tally.crash("token round trip", name, AssertionError("changed"))
        except Exception as exc:
            tally.crash("token round trip", name, exc)


def fuzz_requests(gen: Gen, count: int, tally: Tally) -> None:
    for _ in range(count):
        cls = gen.r.choice(REQUESTS)
        body = gen.bad_body(cls)
        tally.inputs["requests"] += 1
        try:
            decode_request(body, cls)
        except SchemaError:
            pass
        except Exception as exc:
            tally.crash("request", body, exc)


async def fuzz_network(gen: Gen, count: int, tally: Tally) -> None:
    """Bodies sent to real micro endpoints; a body that does not decode must reach no handler
    and get the contract's 400 error body."""
    from partkeeper.bus.permissions import ADMIN, inbox_prefix
    from partkeeper.bus.rpc import Endpoint, ErrorBody, serve
    from partkeeper_sim.stack.natsserver import NatsServer
    from schemas import names

    node = "fuzz-node"
    # the contract's subject of each request (a responder answers only the inboxes of those
    # who may ask it, found by the subject: bus/permissions.py reply_inboxes)
    subjects = {"PodsGet": names.pods_get_subject(node),
                "PodsStates": names.pods_states_subject(node),
                "PendingPodsQuery": names.pods_pending_subject(node),
                "ClaimsQuery": names.claims_query_subject(node),
                "ReclaimNow": names.reclaim_now_subject(node)}

    reached: Counter[str] = Counter()

    def handler(cls: type) -> Any:
        async def handle(request: Any) -> msgspec.Struct:
            reached[cls.__name__] += 1
            return ClaimsReply()  # whatever: only reaching it counts
        return handle

    server = NatsServer().start()
    nc = await nats.connect(server.url, inbox_prefix=inbox_prefix(ADMIN, node))
    try:
        endpoints = [Endpoint(cls.__name__.lower(), subjects[cls.__name__], cls, handler(cls))
                     for cls in REQUESTS]
        service = await serve(nc, name="pk-fuzz", version="0.0.1", description="fuzz",
                              endpoints=endpoints)
        valid: Counter[str] = Counter()
        for _ in range(count):
            cls = gen.r.choice(REQUESTS)
            body = gen.bad_body(cls)
            tally.inputs["network"] += 1
            try:
                decode_request(body, cls)
                valid[cls.__name__] += 1
                good = True
            except SchemaError:
                good = False
            reply = await nc.request(subjects[cls.__name__], body, timeout=5)
            if not good:
                error = msgspec.json.decode(reply.data, type=ErrorBody)
                if error.code != 400:
                    tally.crash("network", body, AssertionError(f"answered {error}"))
                tally.refused += 1
        tally.state_changes = sum((reached - valid).values())
        await service.stop()
    finally:
        await nc.close()
        server.stop()
        shutil.rmtree(server.store_dir, ignore_errors=True)


def run(inputs: int = GOAL, network: int = 2000, seed: int = 1) -> tuple[Tally, float]:
    """Spread `inputs` over the parts (decoders 70%, tokens 15%, requests 15% of which
    `network` over NATS); returns the tally and the seconds it took."""
    gen, tally = Gen(seed), Tally()
    started = time.monotonic()
    fuzz_decoders(gen, inputs * 70 // 100, tally)
    fuzz_tokens(gen, inputs * 15 // 100 // 2, tally)  # two inputs per round
    requests = inputs - sum(tally.inputs.values())
    fuzz_requests(gen, max(0, requests - network), tally)
    asyncio.run(fuzz_network(gen, network, tally))
    return tally, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__)
    parser.add_argument("--inputs", type=int, default=GOAL)
    parser.add_argument("--network", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    tally, seconds = run(args.inputs, args.network, args.seed)
    total = sum(tally.inputs.values())
    parts = ", ".join(f"{k} {v}" for k, v in sorted(tally.inputs.items()))
    print(f"goal: >= {GOAL} generated inputs, 0 crashes, 0 state changes from bad input")
    print(f"measured: {total} inputs in {seconds:.1f}s ({parts}); "
          f"{len(tally.crashes)} crashes, {tally.state_changes} state changes "
          f"({tally.refused} bad bodies refused over NATS with no handler reached; "
          f"seed {args.seed})")
    for crash in tally.crashes:
        print(f"  crash: {crash}")
    return 1 if tally.crashes or tally.state_changes else 0


if __name__ == "__main__":
    sys.exit(main())
