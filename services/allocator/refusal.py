"""How an Allocate says no: a gRPC status and a sentence a person understands."""

from __future__ import annotations

from enum import Enum

import grpc


class Result(Enum):
    """Why an Allocate did not succeed, as the metric label and the gRPC status kubelet sees."""

    FULL = ("full", grpc.StatusCode.RESOURCE_EXHAUSTED)
    NO_POD = ("no_pod", grpc.StatusCode.FAILED_PRECONDITION)
    INVALID = ("invalid", grpc.StatusCode.INVALID_ARGUMENT)
    GONE = ("pod_gone", grpc.StatusCode.ABORTED)
    DRIVER = ("driver_error", grpc.StatusCode.UNAVAILABLE)
    UNAVAILABLE = ("unavailable", grpc.StatusCode.UNAVAILABLE)

    def __init__(self, label: str, code: grpc.StatusCode) -> None:
        self.label = label
        self.code = code


class Refusal(Exception):
    def __init__(self, result: Result, message: str) -> None:
        super().__init__(message)
        self.result = result
        self.message = message
        # The Pod the refused Allocate served, once known: (uid, namespace, name).
        self.pod: tuple[str, str, str] | None = None

    def about(self, uid: str, namespace: str, name: str) -> Refusal:
        if self.pod is None:
            self.pod = (uid, namespace, name)
        return self
