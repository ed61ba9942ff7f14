"""`python -m partkeeper_sim.kubelet` as a process: serves, admits, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from partkeeper.kubelet import (
    open_unix_channel,
    podresources_pb2,
    podresources_pb2_grpc,
    wait_ready,
)
from tests_support import kubeclient as testing
from tests_support import until
from tests_support.kubelet import DEADLINE, RESOURCE, FakePlugin, healthy, short_tmpdir


async def wait_serving(path: Path) -> None:
    """Until the gRPC server at `path` accepts connections (gRPC's own reconnect backoff)."""
    async with open_unix_channel(path) as channel:
        await wait_ready(channel, DEADLINE)


async def wait_allocatable(socket: Path, device: str) -> None:
    """Until kubelet lists `device` as allocatable: Pods arriving earlier fail OutOf<resource>."""
    async with open_unix_channel(socket) as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)

        async def listed() -> bool:
            got = await stub.GetAllocatableResources(podresources_pb2.AllocatableResourcesRequest())
            return any(device in d.device_ids for d in got.devices)

        await until(listed, f"kubelet lists {device} as allocatable", DEADLINE)


async def test_entry_point_runs_until_sigterm(kubeconfig: Path) -> None:
    with short_tmpdir() as directory:
        dp, pr = directory / "dp", directory / "pr.sock"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "partkeeper_sim.kubelet",
            "--kubelet-dir", str(dp), "--pod-resources-socket", str(pr),
            "--node", "node-a", "--kubeconfig", str(kubeconfig),
        )  # fmt: skip
        plugin = FakePlugin(dp, healthy("d0"))
        api = testing.core_v1(kubeconfig)
        try:
            await wait_serving(dp / "kubelet.sock")
            await wait_serving(pr)
            await plugin.serve()
            await plugin.register()
            await wait_allocatable(pr, "d0")
            body = testing.pod_manifest("p", node="node-a")
            body["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE: "1"}}
            await asyncio.to_thread(api.create_namespaced_pod, "default", body)

            def running() -> bool:
                return api.read_namespaced_pod("p", "default").status.phase == "Running"

            await until(lambda: asyncio.to_thread(running), "p Running", DEADLINE)
            assert plugin.allocated_ids() == [["d0"]]

            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), DEADLINE) == 0
            assert not (dp / "kubelet.sock").exists()
            assert not pr.exists()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            await plugin.stop()
            api.api_client.close()
