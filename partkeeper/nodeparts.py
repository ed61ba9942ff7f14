"""What every service that drives the hardware holds (the allocator and the reclaimer): its
configuration, the NATS connection, the claims store and the driver, opened once at start
(`runtime.open_driver`). Each service's `Context` adds its own parts to these."""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext

from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers import Driver


@dataclass(slots=True)
class NodeParts:
    config: Config
    nc: Client
    js: JetStreamContext
    store: ClaimsStore
    driver: Driver

    @property
    def node(self) -> str:
        return self.config.node
