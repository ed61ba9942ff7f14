"""The simulated API server on the test's own event loop, and as a foreground process."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

from kubernetes import client

from partkeeper_sim.apiserver import ApiServer, write_kubeconfig
from tests_support.kubeclient import WatchRecorder, core_v1, pod_manifest


async def test_in_loop_server_with_admin_from_both_threads(tmp_path: Path) -> None:
    async with ApiServer(bookmark_interval=0.05) as server:
        core = core_v1(write_kubeconfig(tmp_path / "kubeconfig", server.url))
        start = server.resource_version
        recorder = WatchRecorder(
            core.list_namespaced_pod, "default", resource_version=str(start), timeout_seconds=60
        ).start()
        try:
            server.create_pod(pod_manifest("from-loop"))
            await asyncio.to_thread(server.create_pod, pod_manifest("from-thread"))
            await asyncio.to_thread(
                core.create_namespaced_pod, "default", pod_manifest("over-http")
            )
            events = await asyncio.to_thread(recorder.wait_count, 3, "ADDED")
        finally:
            await asyncio.to_thread(recorder.stop)
            core.api_client.close()
    names = [e["raw_object"]["metadata"]["name"] for e in events]
    assert names == ["from-loop", "from-thread", "over-http"]


async def test_stop_ends_open_watches(tmp_path: Path) -> None:
    server = ApiServer()
    await server.start()
    core = core_v1(write_kubeconfig(tmp_path / "kubeconfig", server.url))
    recorder = WatchRecorder(core.list_namespaced_pod, "default", timeout_seconds=600).start()
    try:
        server.create_pod(pod_manifest("a"))
        await asyncio.to_thread(recorder.wait_count, 1, "ADDED")
        assert server.open_watches() == 1
        await server.stop()
        events = await asyncio.to_thread(recorder.wait_finished)
    finally:
        await asyncio.to_thread(recorder.stop)
        core.api_client.close()
    assert recorder.error is None and len(events) == 1


def test_module_entry_point_serves_until_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    command = [sys.executable, "-m", "partkeeper_sim.apiserver", "--kubeconfig", str(kubeconfig)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:")
            core = core_v1(kubeconfig)
            core.create_namespaced_pod("default", pod_manifest("a"))
            assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items] == ["a"]
            assert isinstance(core.read_node("node-a"), client.V1Node)
            core.api_client.close()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
