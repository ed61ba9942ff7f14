"""Compatibility alias: the nats-server runner lives in partkeeper.stack.natsserver."""

from partkeeper.stack.natsserver import NatsServer, binary, free_port

__all__ = ["NatsServer", "binary", "free_port"]
