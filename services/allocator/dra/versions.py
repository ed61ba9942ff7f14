"""Which Kubernetes versions DRA mode publishes for, decided from the API server's /version.

`resource.k8s.io/v1` is served from 1.34 on, but the 1.34 API wants a device's counter sets in
the same ResourceSlice as the devices that consume them (at most 32 counters per slice); 1.35
moved them to slices of their own, the shape `partkeeper.dra.slices` publishes. Rather than
publish a shape the server would refuse (or, worse, half take), DRA mode refuses to start on a
server older than 1.35, with a sentence naming the version it found (docs/dra.md).
"""

from __future__ import annotations

import re
from typing import Any

OLDEST = (1, 35)
# Device taints in resource.k8s.io/v1 are stable (on by default, kept by the server) from 1.37;
# before that the DRADeviceTaints gate may be off and the server drops the field silently, so a
# failed card's devices are withdrawn instead (docs/dra.md, "A failed card").
TAINTS_FROM = (1, 37)


def release(document: Any) -> tuple[int, int] | None:
    """(major, minor) from a /version document; managed clusters write minors like "35+"."""
    if not isinstance(document, dict):
        return None
    major = re.match(r"\d+", str(document.get("major", "")))
    minor = re.match(r"\d+", str(document.get("minor", "")))
    if major is None or minor is None:
        return None
    return int(major[0]), int(minor[0])


def refusal(document: Any) -> str | None:
    """Why DRA mode cannot publish for this server, or None when it can."""
    found = release(document)
    shown = document.get("gitVersion") if isinstance(document, dict) else None
    if found is None:
        return (f"DRA mode cannot tell the Kubernetes version from the API server's /version "
                f"({document!r}); it needs 1.{OLDEST[1]} or later")
    if found < OLDEST:
        return (f"DRA mode needs Kubernetes 1.{OLDEST[1]} or later, and the API server is "
                f"{shown or '.'.join(map(str, found))}: before 1.{OLDEST[1]} a ResourceSlice "
                "must hold its counter sets beside the devices that consume them, a shape "
                "partkeeper does not publish (docs/dra.md, Kubernetes versions)")
    return None


def taints(document: Any) -> bool:
    """Whether the server keeps device taints (a failed card's devices are tainted, else
    withdrawn)."""
    found = release(document)
    return found is not None and found >= TAINTS_FROM
