"""The JWT roles (deploy/nats/signing-keys.sh) on a real nats-server in operator mode, accounts
minted without nsc (tests_support/natsjwt.py): one scoped signing key per role of the permission
table, users tagged with their node. Each service user does its work and is refused the rest,
exactly as with the static users of nats.conf (test_access_control.py), which shows the
`{{tag(node)}}` templates expand to the node's subjects; `partkeeper provision` works with a
`.creds` file (NATS_CREDS)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest

from partkeeper.bus import ensure_topology
from partkeeper.bus.permissions import PROVISION, inbox_prefix
from partkeeper_sim.stack.launch import SERVICES
from partkeeper_sim.stack.natsserver import NatsServer
from tests_support.access import (
    NODE,
    OTHER,
    OWN_EVENTS,
    OWN_READS,
    Session,
    all_refused,
    forbidden_watches,
    foreign_inboxes,
    none_refused,
    other_reads,
    others_events,
    topology_changes,
)
from tests_support.natsjwt import Operator

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]


@dataclass
class JwtServer:
    server: NatsServer
    operator: Operator
    directory: Path

    def creds(self, role: str, node: str | None = NODE) -> Path:
        return self.operator.creds(role, node, self.directory)


@pytest.fixture
def jwt() -> Iterator[JwtServer]:
    directory = Path(tempfile.mkdtemp(prefix="pk-jwt-"))
    operator = Operator.made()
    server = NatsServer(config=str(operator.server_config(directory))).start()
    yield JwtServer(server, operator, directory)
    server.stop()
    shutil.rmtree(server.store_dir, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)


def _provision(url: str, creds: Path, timeout: str = "10") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NATS_URL": url, "NATS_CREDS": str(creds)}
    env.pop("NATS_USER", None)
    return subprocess.run([sys.executable, "-m", "partkeeper", "provision", "--timeout", timeout],
                          capture_output=True, text=True, env=env, timeout=60)


async def test_provision_runs_with_its_creds_file_and_a_service_role_cannot(
        jwt: JwtServer) -> None:
    refused = await asyncio.to_thread(_provision, jwt.server.url, jwt.creds("allocator"), "2")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    done = await asyncio.to_thread(_provision, jwt.server.url, jwt.creds(PROVISION, None))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("service", SERVICES)
async def test_a_service_role_does_its_work_and_nothing_else(jwt: JwtServer,
                                                             service: str) -> None:
    provisioner = await nats.connect(jwt.server.url,
                                     user_credentials=str(jwt.creds(PROVISION, None)),
                                     inbox_prefix=inbox_prefix(PROVISION, None))
    try:
        await ensure_topology(provisioner.jetstream())
    finally:
        await provisioner.close()
    session = await Session().open_with(jwt.server.url,
                                        user_credentials=str(jwt.creds(service)))
    try:
        await none_refused(session, OWN_EVENTS[service] + OWN_READS[service],
                            [inbox_prefix(service, NODE) + ".x"])
        await all_refused(session, topology_changes() + other_reads() + forbidden_watches(service)
                           + others_events(service), foreign_inboxes(service))
    finally:
        await session.close()
    # The same role tagged with the other node gets that node's subjects instead.
    other = await Session().open_with(jwt.server.url,
                                      user_credentials=str(jwt.creds(service, OTHER)))
    try:
        await none_refused(other, [s.replace(NODE, OTHER) for s in OWN_EVENTS[service]],
                            [inbox_prefix(service, OTHER) + ".x"])
        await all_refused(other, list(OWN_EVENTS[service]), [])
    finally:
        await other.close()
