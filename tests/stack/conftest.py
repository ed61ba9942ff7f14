"""Markers of the embedded-stack tests: `-m demo` runs the end-to-end demo alone."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "demo: `partkeeper up --demo` end to end (about a minute on two cores)"
    )
    config.addinivalue_line(
        "markers", "stack: starts the whole embedded stack (NATS, cluster, four services)"
    )
