"""Claims: ownership of partitions, written ahead of the hardware, one document per card."""

from partkeeper.claims.machine import TransitionError
from partkeeper.claims.store import ClaimsStore, StoreReadError

__all__ = ["ClaimsStore", "StoreReadError", "TransitionError"]
