"""Failures the simulated API server reports, shaped as Kubernetes `Status` objects.

The real client raises `ApiException` from the HTTP status and keeps the body; tests and the
watcher branch on `status` and `reason`, so both must be what a real API server sends.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request the API server refuses; `code` is the HTTP status, `reason` the Status reason."""

    code = 500
    reason = "InternalError"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.reason, self.message, self.details)


class BadRequest(ApiError):
    code = 400
    reason = "BadRequest"


class NotFound(ApiError):
    code = 404
    reason = "NotFound"


class MethodNotAllowed(ApiError):
    code = 405
    reason = "MethodNotAllowed"


class AlreadyExists(ApiError):
    code = 409
    reason = "AlreadyExists"


class Conflict(ApiError):
    code = 409
    reason = "Conflict"


class Expired(ApiError):
    """A watch asked to resume from a resourceVersion older than the retained history."""

    code = 410
    reason = "Expired"


class UnsupportedMediaType(ApiError):
    code = 415
    reason = "UnsupportedMediaType"


class Invalid(ApiError):
    code = 422
    reason = "Invalid"


class InternalError(ApiError):
    code = 500
    reason = "InternalError"


class ServiceUnavailable(ApiError):
    code = 503
    reason = "ServiceUnavailable"


def status_object(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = details
    return status


def success_status(code: int, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Status a successful delete of a non-Pod or a binding returns."""
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
    }
    if details:
        status["details"] = details
    return status


def not_found(resource: str, name: str) -> NotFound:
    return NotFound(f'{resource} "{name}" not found', details={"name": name, "kind": resource})
