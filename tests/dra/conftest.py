"""Fixtures for DRA tests: the real client's resource.k8s.io/v1 API on the simulated server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config


@pytest.fixture
def resource_api(kubeconfig: Path) -> Iterator[client.ResourceV1Api]:
    api = client.ResourceV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    yield api
    api.api_client.close()
