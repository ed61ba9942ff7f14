"""Encoding and strict decoding. Anything unknown or malformed raises one error: SchemaError."""

from __future__ import annotations

from typing import Any, TypeVar, overload

import msgspec

from schemas.version import SUPPORTED

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


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


def _decode(data: bytes | str, kind: Any, *, what: str, version_required: bool) -> Any:
    try:
        envelope = msgspec.json.decode(data, type=_Envelope)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
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
    except msgspec.DecodeError as exc:
        raise SchemaError(f"{what} is not valid JSON: {exc}") from exc
