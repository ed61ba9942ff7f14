"""The NATS bus: connection, topology, publishing, durable consumers and request/reply."""

from partkeeper.bus.connection import connect
from partkeeper.bus.consumer import ConsumerRunner, Permanent, Retry
from partkeeper.bus.publish import publish
from partkeeper.bus.rpc import BadReply, NoAnswer, RemoteError, Unanswered, request, serve
from partkeeper.bus.topology import ensure_topology, missing_topology

__all__ = [
    "BadReply",
    "ConsumerRunner",
    "NoAnswer",
    "Permanent",
    "RemoteError",
    "Retry",
    "Unanswered",
    "connect",
    "ensure_topology",
    "missing_topology",
    "publish",
    "request",
    "serve",
]
