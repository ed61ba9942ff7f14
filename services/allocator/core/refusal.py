"""Why the allocator does not hand a partition over: a reason and a sentence a person understands.

Domain errors only: the core raises `Refusal`, and each mode turns it into its protocol's answer
(device-plugin mode: a gRPC status, `deviceplugin/plugin.py`; DRA mode: the error string of
NodePrepareResources, `dra/prepare.py`). Nothing here knows a transport.
"""

from __future__ import annotations

from enum import Enum


class Result(Enum):
    """Why an allocation did not succeed, as the metric label says it."""

    FULL = "full"
    NO_POD = "no_pod"
    INVALID = "invalid"
    GONE = "pod_gone"
    DRIVER = "driver_error"
    UNAVAILABLE = "unavailable"

    @property
    def label(self) -> str:
        return self.value


class Refusal(Exception):
    def __init__(self, result: Result, message: str) -> None:
        super().__init__(message)
        self.result = result
        self.message = message
        # The Pod the refused allocation served, once known: (uid, namespace, name).
        self.pod: tuple[str, str, str] | None = None

    def about(self, uid: str, namespace: str, name: str) -> Refusal:
        if self.pod is None:
            self.pod = (uid, namespace, name)
        return self
