"""Errors that end a service at start-up, and only those.

A `StartupError` means this process cannot run here as configured (a bad setting, no driver
library, no kubelet socket): `partkeeper run` prints one JSON log line with the message and exits
non-zero. Anything the bus, the store or the API server does at run time is never one of these.
"""

from __future__ import annotations


class StartupError(Exception):
    """The service cannot start in this environment; the message says what to fix."""
