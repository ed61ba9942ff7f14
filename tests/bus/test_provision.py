"""Provisioning (`partkeeper provision`, docs/contract.md section 4): the one creator of streams and
buckets. The services only look and wait, not ready, with one line saying what is missing; the
buckets get direct get, and a bucket an older version created without it is updated in place
with its values kept (docs/operations.md, "Direct get on existing buckets")."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api

from partkeeper.bus import ensure_topology, missing_topology
from partkeeper.bus.topology import REQUIRED
from partkeeper.config import Config
from partkeeper.runtime import topology_until_ready
from partkeeper_sim.stack.natsserver import NatsServer
from schemas.names import BUCKET_CLAIMS, MAX_MSG_BYTES, STREAM_PODS
from tests_support import until

CONFIG = Path(__file__).resolve().parents[2] / "compose" / "nats" / "nats.conf"


@pytest.fixture
async def bare() -> AsyncIterator[tuple[NatsServer, Client]]:
    """A server nobody has provisioned."""
    server = NatsServer().start()
    client = await nats.connect(server.url)
    yield server, client
    await client.close()
    server.stop()
    shutil.rmtree(server.store_dir, ignore_errors=True)


async def test_everything_is_missing_until_provisioned(bare: tuple[NatsServer, Client]) -> None:
    _, client = bare
    js = client.jetstream()
    assert await missing_topology(js) == list(REQUIRED)
    await ensure_topology(js)
    assert await missing_topology(js) == []
    for stream in REQUIRED:
        if stream.startswith("KV_"):
            assert (await js.stream_info(stream)).config.allow_direct, stream


async def test_a_service_waits_not_ready_until_provisioned(
        bare: tuple[NatsServer, Client], caplog: pytest.LogCaptureFixture) -> None:
    server, client = bare
    stop = asyncio.Event()
    caplog.set_level(logging.WARNING, logger="partkeeper.runtime")
    waiting = asyncio.create_task(
        topology_until_ready(client, Config(nats_urls=(server.url,), node="n"), stop))
    await until(lambda: any("waiting for `partkeeper provision`" in r.getMessage()
                            for r in caplog.records), "the not-ready line", 10)
    assert not waiting.done()
    line = next(r.getMessage() for r in caplog.records if "provision" in r.getMessage())
    assert "PK_PODS" in line and "KV_pk-claims" in line and "\n" not in line
    assert await missing_topology(client.jetstream()) == list(REQUIRED)  # it created nothing
    await ensure_topology(client.jetstream())
    assert await asyncio.wait_for(waiting, 30) is True


async def test_provision_adds_direct_get_to_a_bucket_created_without_it(
        bare: tuple[NatsServer, Client]) -> None:
    """The migration: a bucket of the previous version (no allow_direct) keeps its values and
    revisions, and reads then go through DIRECT.GET with the key in the subject."""
    _, client = bare
    js = client.jetstream()
    old = await js.create_key_value(bucket=BUCKET_CLAIMS, history=5,
                                    storage=api.StorageType.FILE)
    revision = await old.put("node-a.0", b'{"old": true}')
    assert not (await js.stream_info(f"KV_{BUCKET_CLAIMS}")).config.allow_direct
    await ensure_topology(js)  # the other streams are new; this one is updated
    assert (await js.stream_info(f"KV_{BUCKET_CLAIMS}")).config.allow_direct
    assert await missing_topology(js) == []
    migrated = await js.key_value(BUCKET_CLAIMS)
    entry = await migrated.get("node-a.0")
    assert (entry.value, entry.revision) == (b'{"old": true}', revision)
    seen: list[str] = []

    async def on_msg(msg: Msg) -> None:
        seen.append(msg.subject)

    sub = await client.subscribe("$JS.API.DIRECT.GET.>", cb=on_msg)
    try:
        await migrated.get("node-a.0")
        await until(lambda: seen, "a direct get on the wire", 5)
    finally:
        await sub.unsubscribe()
    assert seen == [f"$JS.API.DIRECT.GET.KV_{BUCKET_CLAIMS}.$KV.{BUCKET_CLAIMS}.node-a.0"]


async def test_provision_makes_existing_streams_and_buckets_refuse_purges_and_rollups(
        bare: tuple[NatsServer, Client]) -> None:
    """The upgrade in place (operations.md, "Upgrading to refused purges and rollups"): a
    bucket made by nats-py's create_key_value (rollups and TTLs allowed) and a stream of the
    previous version keep their messages, and afterwards deny purges and deletes, refuse
    rollups, and have their sizes; a service looking meanwhile reads them as not ready."""
    _, client = bare
    js = client.jetstream()
    old = await js.create_key_value(bucket=BUCKET_CLAIMS, history=5, direct=True,
                                    storage=api.StorageType.FILE)
    revision = await old.put("node-a.0", b'{"old": true}')
    await js.add_stream(api.StreamConfig(name=STREAM_PODS, subjects=["pk.pods.>"]))
    await js.publish("pk.pods.node-a.u1", b"{}")
    missing = await missing_topology(js)
    assert f"KV_{BUCKET_CLAIMS} (allowing purges or rollups)" in missing
    await ensure_topology(js)
    assert await missing_topology(js) == []
    for name in (f"KV_{BUCKET_CLAIMS}", STREAM_PODS):
        config = (await js.stream_info(name)).config
        assert config.deny_purge and config.deny_delete and not config.allow_rollup_hdrs
        assert config.max_msg_size == MAX_MSG_BYTES and (config.max_bytes or 0) > 0
    entry = await (await js.key_value(BUCKET_CLAIMS)).get("node-a.0")
    assert (entry.value, entry.revision) == (b'{"old": true}', revision)
    assert (await js.stream_info(STREAM_PODS)).state.messages == 1
    with pytest.raises(nats.js.errors.APIError):
        await js.publish(f"$KV.{BUCKET_CLAIMS}.node-a.1", b"{}", headers={"Nats-Rollup": "all"})
    with pytest.raises(nats.js.errors.APIError):
        await js.purge_stream(f"KV_{BUCKET_CLAIMS}")
    assert (await (await js.key_value(BUCKET_CLAIMS)).get("node-a.0")).value == b'{"old": true}'


def _provision(url: str, user: str, password: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NATS_URL": url, "NATS_USER": user, "NATS_PASSWORD": password}
    return subprocess.run([sys.executable, "-m", "partkeeper", "provision", "--timeout", "4"],
                          capture_output=True, text=True, env=env, timeout=60)


async def test_the_command_provisions_as_pk_provision_and_a_service_user_cannot() -> None:
    server = NatsServer(config=str(CONFIG)).start()
    try:
        refused = await asyncio.to_thread(_provision, server.url, "pk-gc", "pk-gc-dev")
        assert refused.returncode == 1, refused.stderr
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith("partkeeper provision: "), refused.stderr
        done = await asyncio.to_thread(_provision, server.url, "pk-provision", "pk-provision-dev")
        assert done.returncode == 0, done.stderr
        assert "PK_PODS" in done.stdout and "KV_pk-capacity" in done.stdout
        again = await asyncio.to_thread(_provision, server.url, "pk-provision",
                                        "pk-provision-dev")
        assert again.returncode == 0, again.stderr  # idempotent
    finally:
        server.stop()
        shutil.rmtree(server.store_dir, ignore_errors=True)
