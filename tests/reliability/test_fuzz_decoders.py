"""Fuzzing every decoder of the wire contract (invariant 10): whatever the bytes, `schemas.decode`
either returns the kind asked for or raises SchemaError, never anything else; and every valid
struct survives encode -> decode unchanged."""

from __future__ import annotations

import contextlib
import json
import types
import typing
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    encode,
)
from schemas.events import (
    AllocateRefused,
    CardHealthChanged,
    CardUnhealthy,
    ClaimChanged,
    DestroyFailed,
    ForeignFound,
    ForeignGone,
    PodFinished,
    PodGone,
    PodSeen,
    WorkdirCollected,
)

pytestmark = pytest.mark.reliability

KINDS: dict[str, Any] = {
    "PodEvent": PodEvent, "PartitionEvent": PartitionEvent, "CardClaims": CardClaims,
    "PodRecord": PodRecord, "NodeCapacity": NodeCapacity, "PodsGet": PodsGet,
    "PodsGetReply": PodsGetReply, "PendingPodsQuery": PendingPodsQuery,
    "PendingPodsReply": PendingPodsReply, "ClaimsQuery": ClaimsQuery, "ClaimsReply": ClaimsReply,
    "ReclaimNow": ReclaimNow, "ReclaimNowReply": ReclaimNowReply,
}
STRUCTS = (PodSeen, PodFinished, PodGone, ClaimChanged, DestroyFailed, ForeignFound, ForeignGone,
           WorkdirCollected, AllocateRefused, CardUnhealthy, CardHealthChanged, CardClaims,
           PodRecord, NodeCapacity, PodsGet, PodsGetReply, PendingPodsQuery, PendingPodsReply,
           ClaimsQuery, ClaimsReply, ReclaimNow, ReclaimNowReply)
# The union each event is decoded as (a union is a typing form, not a `type`: hence Any).
UNION_OF: dict[type, Any] = {**dict.fromkeys((PodSeen, PodFinished, PodGone), PodEvent),
            **dict.fromkeys((ClaimChanged, DestroyFailed, ForeignFound, ForeignGone,
                             WorkdirCollected, AllocateRefused, CardUnhealthy,
                             CardHealthChanged),
                                            PartitionEvent)}
TAGS = ["PodSeen", "PodFinished", "PodGone", "ClaimChanged", "CardUnhealthy", "CardClaims",
        "PodRecord",
        "NodeCapacity", "PodsGet", "ClaimsQuery", "ReclaimNow", "Nope", ""]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=6),
    max_leaves=25,
)
# Objects that get past the version check: right `v` (or near misses), a real or fake tag.
envelopes = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 0, 2, -1, "1", 1.0, True, None]), "type": st.sampled_from(TAGS)},
).flatmap(lambda head: st.dictionaries(st.text(max_size=16), json_values, max_size=8)
          .map(lambda rest: {**rest, **head}))


def only_schema_errors(data: bytes | str, kind: Any) -> None:
    with contextlib.suppress(SchemaError):
        decode(data, kind)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """Values of a contract field's type (msgspec's own limits: 64-bit ints, finite floats)."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return struct_of(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return st.lists(strategy_for(args[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=3)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([strategy_for(a) for a in args])
    if origin is typing.Literal:
        return st.sampled_from(args)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: st.text(max_size=24), bool: st.booleans(), type(None): st.none(),
        int: st.integers(min_value=-(2**63), max_value=2**64 - 1),
        float: st.floats(allow_nan=False, allow_infinity=False),
    }
    return simple[tp]


def struct_of(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: strategy_for(hints[f.name])
              for f in msgspec.structs.fields(cls) if f.name != "v"}
    return st.builds(cls, **fields)


@pytest.mark.parametrize("name", sorted(KINDS))
@FUZZ
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(name: str, data: bytes) -> None:
    only_schema_errors(data, KINDS[name])


@pytest.mark.parametrize("name", sorted(KINDS))
@FUZZ
@given(value=json_values | envelopes)
def test_arbitrary_json(name: str, value: Any) -> None:
    only_schema_errors(json.dumps(value), KINDS[name])


@pytest.mark.parametrize("struct", STRUCTS, ids=lambda s: s.__name__)
@FUZZ
@given(data=st.data())
def test_valid_structs_round_trip_and_survive_mutation(struct: type, data: st.DataObject) -> None:
    value = data.draw(struct_of(struct))
    kind = UNION_OF.get(struct, struct)
    wire = encode(value)
    assert decode(wire, kind) == value
    # The same document with one field replaced by anything: decoded strictly or refused.
    doc = msgspec.json.decode(wire)
    key = data.draw(st.sampled_from(sorted(doc)))
    doc[key] = data.draw(json_values)
    only_schema_errors(json.dumps(doc), kind)
    # Truncated anywhere: never anything but SchemaError.
    cut = data.draw(st.integers(min_value=0, max_value=len(wire)))
    only_schema_errors(wire[:cut], kind)
