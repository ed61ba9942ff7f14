"""What the HTTP handlers share: the store, the watch hub and the switches tests flip."""

from __future__ import annotations

from dataclasses import dataclass

from .store import Store
from .watch import WatchHub


@dataclass
class ServerState:
    store: Store
    hub: WatchHub
    # Seconds between BOOKMARK events on watches that ask for them.
    bookmark_interval: float = 1.0
    # A GET of an unknown Node creates it, as a kubelet registering itself would have.
    auto_create_nodes: bool = True
    unavailable: bool = False
    # What /version answers ("1.35"); tests set another to see a client refuse it.
    kubernetes_version: str = "1.35"
