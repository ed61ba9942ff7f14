"""Holding a connection's PK_PARTITIONS publishes until the test lets them go.

The claims store announces each transition after its write without making the writer wait
(partkeeper/claims/store.py); a test that asserts what an operation waited for holds the audit
publishes, checks the operation finished, then lets them go. The hold wraps `nc.request` on top
of any counting (partkeeper.bus.trips), so a held publish is not counted until it is made.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

AUDIT_PREFIX = "pk.parts."


def hold_audit(nc: Client) -> asyncio.Event:
    """Park every PK_PARTITIONS publish made on `nc` until the returned event is set."""
    held = asyncio.Event()
    request = nc.request

    async def audit_held(subject: str, payload: bytes = b"", timeout: float = 0.5,
                         old_style: bool = False, headers: dict[str, Any] | None = None
                         ) -> Msg:
        if subject.startswith(AUDIT_PREFIX):
            await held.wait()
        return await request(subject, payload, timeout=timeout, old_style=old_style,
                             headers=headers)

    nc.request = audit_held  # type: ignore[method-assign]
    return held
