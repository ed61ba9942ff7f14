"""The operator's commands in the agent image: `partkeeper --version`, `partkeeper status` with
the deployment's NATS credentials."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import partkeeper
from partkeeper.bus.connection import credentials
from partkeeper.config import load
from partkeeper_sim.stack.natsserver import NatsServer

CONFIG = Path(__file__).resolve().parents[2] / "compose" / "nats" / "nats.conf"


def partkeeper_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "partkeeper", *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def secured() -> Iterator[NatsServer]:
    server = NatsServer(config=str(CONFIG)).start()
    yield server
    server.stop()


def test_version() -> None:
    result = partkeeper_cli("--version", env={})
    assert result.returncode == 0
    assert result.stdout.strip() == f"partkeeper {partkeeper.__version__}"


def test_status_uses_nats_user_and_password(secured: NatsServer) -> None:
    base = {"NATS_URL": secured.url, "PK_NODE_NAME": "sim-node-0", "PATH": "/usr/bin:/bin"}
    refused = partkeeper_cli("status", "--json", env=base)
    assert refused.returncode == 1
    assert "authorization violation" in refused.stderr.lower()
    admitted = partkeeper_cli(
        "status", "--json", env={**base, "NATS_USER": "pk-admin", "NATS_PASSWORD": "pk-admin-dev"})
    assert admitted.returncode == 1  # no allocator published capacity: past authentication
    assert "no capacity published for node 'sim-node-0'" in admitted.stderr


def test_credentials_from_the_environment() -> None:
    assert credentials(load({})) == {}
    assert credentials(load({"NATS_USER": "pk-admin", "NATS_PASSWORD": "pw"})) == {
        "user": "pk-admin", "password": "pw"}
    assert credentials(load({"NATS_CREDS": "/etc/partkeeper/nats/user.creds"})) == {
        "user_credentials": "/etc/partkeeper/nats/user.creds"}
