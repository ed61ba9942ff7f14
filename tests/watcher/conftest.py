"""Watcher test settings (the watcher and the events it published: tests/conftest.py)."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
