"""Encoding and strict decoding. Anything unknown or malformed raises one error: SchemaError.

One decode contract for every message and request: a body larger than `MAX_BYTES` or nested
deeper than `MAX_DEPTH` is refused before the decoder sees it (msgspec recurses on the C stack
and raises RecursionError a few thousand levels down, which nothing would map to a schema
error: a few KB of valid JSON restarted services), and whatever else goes wrong while decoding
(not JSON, not UTF-8, wrong types, unknown version) is the same SchemaError.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

import msgspec

from schemas.names import MAX_MSG_BYTES
from schemas.version import SUPPORTED

T = TypeVar("T")

_encoder = msgspec.json.Encoder()

MAX_BYTES = MAX_MSG_BYTES  # what a stream or bucket takes (names.MAX_MSG_BYTES)
# The deepest any contract message nests is 4 (a reply's list of claims' lists); room for more.
MAX_DEPTH = 32
_OPENERS = (ord("["), ord("{"))


class SchemaError(ValueError):
    """A payload could not be decoded: not JSON, unknown schema version, unknown type, bad field."""


class _Envelope(msgspec.Struct):
    v: Any = None
    type: Any = None


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


@overload
def decode(data: bytes | str, kind: type[T], *, what: str = "message") -> T: ...
@overload
def decode(data: bytes | str, kind: Any, *, what: str = "message") -> Any: ...


def decode(data: bytes | str, kind: Any, *, what: str = "message") -> Any:
    """Decode `data` as `kind` (a struct or a union of tagged structs), strictly.

    The version is checked before the body so that a newer producer gets a message saying so
    rather than a confusing field error.
    """
    return _decode(data, kind, what=what, version_required=True)


def decode_request(data: bytes | str, kind: type[T], *, what: str = "request") -> T:
    """Decode a request body as `kind`: like `decode`, except that a body without `v` is read as
    the current version (a request typed by hand or with the `nats` CLI). An unknown `v` is still
    refused, and so is a `type` naming another request."""
    decoded: T = _decode(data, kind, what=what, version_required=False)
    return decoded


def check_bounds(data: bytes | str, *, what: str = "message") -> None:
    """Raise SchemaError when `data` is larger than MAX_BYTES or nests deeper than MAX_DEPTH.

    Counting the brackets is enough for nearly every body (fewer than MAX_DEPTH of them cannot
    nest deeper); only the rest is scanned, skipping strings."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > MAX_BYTES:
        raise SchemaError(f"{what} is {len(raw)} bytes, more than the {MAX_BYTES} any message "
                          f"may be")
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in _OPENERS:
            depth += 1
            if depth > MAX_DEPTH:
                raise SchemaError(f"{what} nests deeper than {MAX_DEPTH} levels")
        elif byte in (0x5D, 0x7D):  # closing bracket or brace
            depth -= 1


def _decode(data: bytes | str, kind: Any, *, what: str, version_required: bool) -> Any:
    check_bounds(data, what=what)
    try:
        envelope = msgspec.json.decode(data, type=_Envelope)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError,
            TypeError) as exc:
        raise SchemaError(f"{what} is not a JSON object: {exc}") from exc
    if envelope.v is None:
        if version_required:
            raise SchemaError(f"{what} has no schema version field 'v'")
        return _body(data, kind, what, envelope)
    if not isinstance(envelope.v, int) or isinstance(envelope.v, bool):
        raise SchemaError(f"{what} has a non-integer schema version {envelope.v!r}")
    if envelope.v not in SUPPORTED:
        supported = ", ".join(str(s) for s in sorted(SUPPORTED))
        raise SchemaError(
            f"{what} has schema version {envelope.v}, this build reads version(s) {supported}"
        )
    return _body(data, kind, what, envelope)


def _body(data: bytes | str, kind: Any, what: str, envelope: _Envelope) -> Any:
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise SchemaError(f"{what} (type {envelope.type!r}) is invalid: {exc}") from exc
    except (msgspec.DecodeError, RecursionError, ValueError, TypeError) as exc:
        raise SchemaError(f"{what} is not valid JSON: {exc}") from exc
