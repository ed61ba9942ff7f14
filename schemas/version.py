"""Schema versions this code reads and writes."""

CURRENT = 1
SUPPORTED = frozenset({1})
