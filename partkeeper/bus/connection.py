"""Connecting to NATS with credentials from the configuration and reconnecting forever."""

from __future__ import annotations

import logging
from typing import Any

import nats
from nats.aio.client import Client

from partkeeper.bus.permissions import PROVISION, inbox_prefix
from partkeeper.config import Config
from partkeeper.telemetry import metrics
from schemas.names import encode_token

log = logging.getLogger(__name__)

PING_SECONDS = 5
MAX_OUTSTANDING_PINGS = 3


async def connect(config: Config, name: str, *, connect_timeout: float = 2.0) -> Client:
    """Connect, retrying while the server is unreachable; reconnect forever afterwards.

    Services must not die when NATS restarts: the client buffers while reconnecting and the
    durable consumers resume where they were. Replies come to the connection's private inbox,
    `_INBOX.<node token>.<name>` (provisioning, which serves no node: `_INBOX._cluster.provision`),
    the only inbox its NATS user may subscribe to (bus/permissions.py).
    """

    async def on_error(exc: Exception) -> None:
        log.warning("nats connection error: %s", exc)

    opened: list[Client] = []

    async def on_disconnect() -> None:
        metrics.NATS_CONNECTIONS.set(0)
        # nats-py calls this on a close we asked for too (provisioning's connection ends so):
        # only a lost connection is a fault worth a warning.
        if opened and opened[0].is_closed:
            log.debug("nats connection closed")
            return
        log.warning("nats disconnected; reconnecting")

    async def on_reconnect() -> None:
        metrics.NATS_CONNECTIONS.set(1)
        log.info("nats reconnected")

    options: dict[str, Any] = {
        "servers": list(config.nats_urls),
        "name": f"partkeeper-{name}-{config.node}",
        "inbox_prefix": inbox_prefix(name, None if name == PROVISION
                                     else encode_token(config.node)),
        "connect_timeout": connect_timeout,
        "reconnect_time_wait": 0.5,
        # A connection that stops answering (a half-open TCP connection, a black-holed route)
        # is declared stale after PING_SECONDS x MAX_OUTSTANDING_PINGS and replaced; the
        # client's default (2 min x 2) would leave a service deaf for four minutes.
        "ping_interval": PING_SECONDS,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
        "max_reconnect_attempts": -1,
        "allow_reconnect": True,
        "error_cb": on_error,
        "disconnected_cb": on_disconnect,
        "reconnected_cb": on_reconnect,
    }
    nc = await nats.connect(**options, **credentials(config))
    opened.append(nc)
    metrics.NATS_CONNECTIONS.set(1)
    return nc


def credentials(config: Config) -> dict[str, Any]:
    """nats.connect keyword arguments for NATS_USER/NATS_PASSWORD and NATS_CREDS."""
    options: dict[str, Any] = {}
    if config.nats_user:
        options["user"] = config.nats_user
        options["password"] = config.nats_password or ""
    if config.nats_creds:
        options["user_credentials"] = config.nats_creds
    return options
