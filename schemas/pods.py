"""What the contract says about a Pod: its identity and the resources its containers request."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

# Kubernetes UIDs are RFC 4122 UUIDs; we accept lowercase hex-and-dash tokens of that shape and
# length so that a UID can never carry a path separator, a dot or a subject wildcard.
_POD_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]
PodState = Literal["live", "finished", "gone", "unknown"]


class InvalidPodUID(ValueError):
    """A Pod UID that is not a lowercase RFC 4122 UUID."""


def validate_pod_uid(uid: object) -> str:
    """Return `uid` if it is a well-formed Pod UID, else raise InvalidPodUID saying why."""
    if not isinstance(uid, str):
        raise InvalidPodUID(f"Pod UID must be a string, got {type(uid).__name__}")
    if not _POD_UID.fullmatch(uid):
        shown = uid if len(uid) <= 80 else uid[:77] + "..."
        raise InvalidPodUID(f"Pod UID {shown!r} is not a lowercase RFC 4122 UUID")
    return uid


def is_pod_uid(value: object) -> bool:
    """Whether `value` is a well-formed Pod UID (validate_pod_uid says why one is not)."""
    return isinstance(value, str) and _POD_UID.fullmatch(value) is not None


class ContainerRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One container and its requests of partkeeper's resources (resource name -> quantity)."""

    name: str
    requests: dict[str, int] = {}
