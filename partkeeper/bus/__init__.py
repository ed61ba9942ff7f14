"""The NATS bus: connection, topology, publishing, durable consumers and request/reply."""

from partkeeper.bus import backoff
from partkeeper.bus.connection import connect
from partkeeper.bus.consumer import ConsumerRunner, Permanent, Retry
from partkeeper.bus.publish import publish
from partkeeper.bus.rpc import NoAnswer, RemoteError, request, serve
from partkeeper.bus.topology import ensure_topology

__all__ = [
    "ConsumerRunner",
    "NoAnswer",
    "Permanent",
    "RemoteError",
    "Retry",
    "backoff",
    "connect",
    "ensure_topology",
    "publish",
    "request",
    "serve",
]
