"""Markers of the reliability suite: `-m reliability` runs it alone."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "reliability: the four services as processes on a real nats-server, "
                   "with crashes, restarts and bad input"
    )
