"""A real DRA allocator process killed at each fault point of a prepare, then restarted:
kubelet's retry of NodePrepareResources gets the same partition, completed if need be, and never a
second one (invariants 4, 7 and 8 in DRA mode)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import grpc
import pytest

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.dra import DRIVER
from partkeeper.faults import EXIT_STATUS
from partkeeper.kubelet import (
    dra_pb2,
    dra_pb2_grpc,
    dra_registration_pb2,
    dra_registration_pb2_grpc,
    open_unix_channel,
)
from partkeeper_sim.driver import SimDriver, init_state
from schemas.names import BUCKET_CLAIMS
from tests_support import until
from tests_support.dra import NAMESPACE, claim_body

DEVICE = "gpu-0-mig-3g40gb-4"


def env_for(directory: Path, url: str, node: str, kubeconfig: Path, faults: str) -> dict:
    return {
        **os.environ,
        "NATS_URL": url, "PK_NODE_NAME": node, "PK_MODE": "dra", "KUBECONFIG": str(kubeconfig),
        "PK_KUBELET_DIR": str(directory / "dp"), "PK_CDI_DIR": str(directory / "cdi"),
        "PK_POD_RESOURCES_SOCKET": str(directory / "absent.sock"),
        "PK_PODS_DIR": str(directory / "pods"), "PK_DRIVER": "sim",
        "PK_SIM_STATE": str(directory / "sim.json"), "PK_FAULTS": faults,
        "PK_METRICS_PORT": "0", "PK_LOG_LEVEL": "warning",
    }


async def start(directory: Path, env: dict) -> asyncio.subprocess.Process:
    registration = directory / "plugins_registry" / f"{DRIVER}-reg.sock"
    registration.unlink(missing_ok=True)
    log = (directory / "allocator.log").open("ab")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.allocator", env=env, stdout=log, stderr=log)
    log.close()
    await until(lambda: answers(registration, proc), "the DRA plugin answers", 30)
    assert proc.returncode is None, (directory / "allocator.log").read_text()
    return proc


async def answers(socket: Path, proc: asyncio.subprocess.Process) -> bool:
    if proc.returncode is not None:
        return True
    async with open_unix_channel(socket) as channel:
        try:
            await dra_registration_pb2_grpc.RegistrationStub(channel).GetInfo(
                dra_registration_pb2.InfoRequest(), timeout=1)
        except grpc.aio.AioRpcError:
            return False
    return True


async def prepare(directory: Path, ref: dra_pb2.Claim) -> dra_pb2.NodePrepareResourceResponse:
    socket = directory / "plugins" / DRIVER / "dra.sock"
    async with open_unix_channel(socket) as channel:
        reply = await dra_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=20)
    return reply.claims[ref.uid]


async def allocated_claim(resource_api, node: str) -> dra_pb2.Claim:
    made = resource_api.create_namespaced_resource_claim(NAMESPACE, claim_body("c1", "3g.40gb"))
    resource_api.patch_namespaced_resource_claim_status("c1", NAMESPACE, {"status": {
        "allocation": {"devices": {"results": [{"request": "mig", "driver": DRIVER,
                                                "pool": node, "device": DEVICE}]}},
        "reservedFor": [{"resource": "pods", "name": "p1",
                         "uid": "5d7f0c2e-9a1b-4c3d-8e7f-6a5b4c3d2e1f"}]}})
    return dra_pb2.Claim(namespace=NAMESPACE, uid=made.metadata.uid, name="c1")


@pytest.mark.parametrize("point", ["after_claim", "after_create", "after_active"])
async def test_crash_at_each_fault_point_then_the_retry_completes(
    nc, js, node, nats_server, kubeconfig, resource_api, point: str
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="pkd", dir="/tmp"))
    procs: list[asyncio.subprocess.Process] = []
    try:
        init_state(directory / "sim.json", ["H100-80GB"], [])
        driver = SimDriver(directory / "sim.json")
        store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), node)
        ref = await allocated_claim(resource_api, node)
        env = env_for(directory, nats_server.url, node, kubeconfig, f"allocator.{point}=exit")

        procs.append(await start(directory, env))
        with pytest.raises(grpc.aio.AioRpcError):
            await prepare(directory, ref)  # the process dies inside the call
        assert await asyncio.wait_for(procs[0].wait(), 20) == EXIT_STATUS
        doc, _ = await store.read(0)
        [left] = doc.claims.values()
        assert left.state == ("active" if point == "after_active" else "creating")
        assert left.id == f"{ref.uid}.{DEVICE}"

        procs.append(await start(directory, {**env, "PK_FAULTS": ""}))
        answer = await prepare(directory, ref)  # kubelet retries

        [inst] = await asyncio.to_thread(driver.instances, 0)
        assert (inst.profile, inst.start) == ("3g.40gb", 4)
        doc, _ = await store.read(0)
        [done] = doc.claims.values()
        assert done.id == left.id and done.state == "active"
        assert done.instance is not None and done.instance.uuid == inst.uuid
        assert answer.error == "" and answer.devices[0].device_name == DEVICE
        (spec_file,) = (directory / "cdi").iterdir()
        env_lines = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["env"]
        assert f"NVIDIA_VISIBLE_DEVICES={inst.uuid}" in env_lines
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 10)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        shutil.rmtree(directory, ignore_errors=True)
