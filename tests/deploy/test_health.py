"""Probes and start-up failures of real service processes (the DaemonSet's probes hit these).

Ready means the service's NATS work is up and, for the allocator, every plugin is registered with
the kubelet now at kubelet.sock; live means its event loop still turns. A deployment error found
at start is one JSON log line and exit status 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from partkeeper.health import Health
from partkeeper_sim.driver import init_state
from partkeeper_sim.kubelet import MemoryPodSource, SimKubelet
from partkeeper_sim.stack.natsserver import NatsServer, free_port
from tests_support import until


async def probe(port: int, path: str) -> tuple[int, dict | str]:
    return await asyncio.to_thread(_get, port, path)


def _get(port: int, path: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            status, body = reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode()
    except OSError:
        return 0, ""
    return status, (json.loads(body) if body.startswith("{") else body)


@pytest.fixture
def workdir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="pkh", dir="/tmp"))  # short: unix socket paths
    init_state(directory / "sim.json", ["H100-80GB"], [])
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


async def start(service: str, directory: Path, nats_server: NatsServer, node: str,
                **env: str) -> tuple[asyncio.subprocess.Process, Path]:
    log = directory / f"{service}.log"
    environment = {
        **os.environ, "NATS_URL": nats_server.url, "PK_NODE_NAME": node, "PK_DRIVER": "sim",
        "PK_SIM_STATE": str(directory / "sim.json"), "PK_PODS_DIR": str(directory / "pods"),
        "PK_KUBELET_DIR": str(directory / "dp"),
        "PK_POD_RESOURCES_SOCKET": str(directory / "absent.sock"), "PK_LOG_LEVEL": "info",
        **env,
    }
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "partkeeper", "run", service, env=environment,
            stdout=out, stderr=out)
    return proc, log


@pytest.fixture
async def processes() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    procs: list[asyncio.subprocess.Process] = []
    yield procs
    for proc in procs:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)


async def test_reclaimer_is_ready_once_its_nats_work_runs(
    nats_server: NatsServer, node: str, workdir: Path, processes: list
) -> None:
    port = free_port()
    proc, log = await start("reclaimer", workdir, nats_server, node, PK_METRICS_PORT=str(port))
    processes.append(proc)
    async def ready_or_ended() -> bool:
        return (await probe(port, "/readyz"))[0] == 200 or proc.returncode is not None

    await until(ready_or_ended, "the reclaimer answers ready", timeout=60)
    assert proc.returncode is None, log.read_text()
    status, body = await probe(port, "/readyz")
    assert body == {"ready": True, "conditions": {"nats": True, "reclaimer": True}}
    assert (await probe(port, "/livez"))[0] == 200
    status, text = await probe(port, "/metrics")
    assert status == 200 and 'partkeeper_build_info{python=' in text


async def test_allocator_is_ready_only_while_registered_with_kubelet(
    nats_server: NatsServer, node: str, workdir: Path, processes: list
) -> None:
    port = free_port()
    proc, log = await start("allocator", workdir, nats_server, node, PK_METRICS_PORT=str(port))
    processes.append(proc)

    async def conditions() -> dict:
        _, body = await probe(port, "/readyz")
        return body.get("conditions", {}) if isinstance(body, dict) else {}

    async def serving_or_ended() -> bool:
        return bool((await conditions()).get("allocator")) or proc.returncode is not None

    await until(serving_or_ended, "the allocator serves its plugins", timeout=60)
    assert proc.returncode is None, log.read_text()
    assert (await probe(port, "/readyz"))[0] == 503  # no kubelet.sock yet
    assert (await conditions())["kubelet registration"] is False
    kubelet = SimKubelet(workdir / "dp", MemoryPodSource(),
                         pod_resources_socket=workdir / "pr.sock")
    await kubelet.start()
    try:
        async def ready() -> bool:
            return (await probe(port, "/readyz"))[0] == 200

        await until(ready, "ready once registered", timeout=30)
        assert await conditions() == {"allocator": True, "kubelet registration": True, "nats": True}
    finally:
        await kubelet.stop()

    async def unregistered() -> bool:
        return (await conditions()).get("kubelet registration") is False

    await until(unregistered, "not ready once the kubelet is gone", timeout=30)
    assert (await probe(port, "/livez"))[0] == 200  # waiting for a kubelet is no reason to restart


async def test_allocator_that_cannot_serve_in_the_kubelet_dir_exits_with_one_line(
    nats_server: NatsServer, node: str, workdir: Path
) -> None:
    (workdir / "file").write_text("not a directory")
    proc, log = await start("allocator", workdir, nats_server, node, PK_METRICS_PORT="0",
                            PK_KUBELET_DIR=str(workdir / "file" / "dp"))
    assert await asyncio.wait_for(proc.wait(), 60) == 2
    text = log.read_text()
    assert "Traceback" not in text
    lines = [json.loads(raw) for raw in text.splitlines() if raw.startswith("{")]
    (line,) = [x for x in lines if x["level"] == "error"]
    assert "PK_KUBELET_DIR" in line["msg"]
    assert str(workdir / "file" / "dp") in line["msg"]


def _broken() -> bool:
    raise ZeroDivisionError("the check itself fails")


def test_readiness_needs_every_condition_and_forgets_them_with_their_scope() -> None:
    health = Health()
    assert health.readiness() == (False, {})  # nothing said yet is not ready
    up = {"value": False}
    with health.condition("nats", lambda: up["value"]):
        assert health.readiness() == (False, {"nats": False})
        up["value"] = True
        with health.condition("kubelet", _broken):  # a failing check does not hold
            assert health.readiness() == (False, {"kubelet": False, "nats": True})
        assert health.readiness() == (True, {"nats": True})
    assert health.readiness() == (False, {})


def test_liveness_fails_when_the_loop_stops_beating() -> None:
    health = Health(stale_after=15)
    assert health.liveness()[0]  # starting
    health.stamp()
    assert health.liveness()[0]
    stamped = health._last_beat
    assert stamped is not None
    assert not health.liveness(now=stamped + 16)[0]
