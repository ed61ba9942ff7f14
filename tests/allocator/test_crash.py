"""A real allocator process killed at each fault point, then restarted: kubelet's retry of the
same Allocate gets the same partition, completed if need be, and never a second one (invariants 7
and 8; the start-up rule for `creating` claims)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import grpc
import pytest

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.faults import EXIT_STATUS
from partkeeper.kubelet import deviceplugin_pb2 as pb
from partkeeper.kubelet import deviceplugin_pb2_grpc, open_unix_channel
from partkeeper_sim.driver import SimDriver, init_state
from schemas.names import BUCKET_CLAIMS, BUCKET_PODS
from services.allocator.deviceplugin.registration import endpoint_name
from tests_support import until
from tests_support.allocator import MIG
from tests_support.allocator_peers import TableWatcher

R3 = MIG + "3g.40gb"
TOKEN = "3g.40gb-1"


async def start(directory: Path, url: str, node: str, faults: str) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "NATS_URL": url, "PK_NODE_NAME": node, "PK_KUBELET_DIR": str(directory / "dp"),
        "PK_POD_RESOURCES_SOCKET": str(directory / "absent.sock"),
        "PK_PODS_DIR": str(directory / "pods"), "PK_DRIVER": "sim",
        "PK_SIM_STATE": str(directory / "sim.json"), "PK_FAULTS": faults,
        "PK_METRICS_PORT": "0", "PK_LOG_LEVEL": "warning",
    }
    log = (directory / "allocator.log").open("ab")
    socket = directory / "dp" / endpoint_name(R3)
    socket.unlink(missing_ok=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.allocator", env=env, stdout=log, stderr=log)
    log.close()
    await until(lambda: answers(socket, proc), "the allocator process serves its plugin sockets",
                timeout=30)
    assert proc.returncode is None, (directory / "allocator.log").read_text()
    return proc


async def answers(socket: Path, proc: asyncio.subprocess.Process) -> bool:
    """The plugin answers on its socket (a bound socket may not be listening yet), or the process
    has ended."""
    if proc.returncode is not None:
        return True
    async with open_unix_channel(socket) as channel:
        try:
            await deviceplugin_pb2_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                pb.Empty(), timeout=1)
        except grpc.aio.AioRpcError:
            return False
    return True


async def allocate(directory: Path) -> pb.ContainerAllocateResponse:
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(
        devices_ids=[TOKEN])])
    async with open_unix_channel(directory / "dp" / endpoint_name(R3)) as channel:
        reply = await deviceplugin_pb2_grpc.DevicePluginStub(channel).Allocate(request,
                                                                               timeout=20)
    return reply.container_responses[0]


@pytest.mark.parametrize("point", ["after_claim", "after_create", "after_active"])
async def test_crash_at_each_fault_point_then_the_retry_completes(
    nc, js, node, nats_server, point: str
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="pk", dir="/tmp"))
    procs: list[asyncio.subprocess.Process] = []
    watcher = await TableWatcher(nc, await js.key_value(BUCKET_PODS), node).start()
    try:
        init_state(directory / "sim.json", ["H100-80GB"], [])
        driver = SimDriver(directory / "sim.json")
        store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), node)
        uid = "5d7f0c2e-9a1b-4c3d-8e7f-6a5b4c3d2e1f"
        await watcher.add(watcher.record(uid, "a", {"main": {R3: 1}}))

        procs.append(await start(directory, nats_server.url, node, f"allocator.{point}=exit"))
        with pytest.raises(grpc.aio.AioRpcError):
            await allocate(directory)  # the process dies inside the call
        assert await asyncio.wait_for(procs[0].wait(), 20) == EXIT_STATUS
        doc, _ = await store.read(0)
        [left] = doc.claims.values()
        assert left.state == ("active" if point == "after_active" else "creating")

        procs.append(await start(directory, nats_server.url, node, ""))
        reply = await allocate(directory)  # kubelet retries with the same device IDs

        [inst] = await asyncio.to_thread(driver.instances, 0)
        doc, _ = await store.read(0)
        [done] = doc.claims.values()
        assert done.id == left.id and done.state == "active"
        assert done.instance is not None and done.instance.uuid == inst.uuid
        assert reply.envs["NVIDIA_VISIBLE_DEVICES"] == inst.uuid
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 10)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await watcher.stop()
        shutil.rmtree(directory, ignore_errors=True)
