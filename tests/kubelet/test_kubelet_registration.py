"""Registration, ListAndWatch consumption and kubelet restarts of the simulated kubelet."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest

from partkeeper.kubelet import UNHEALTHY, deviceplugin_pb2
from partkeeper_sim.kubelet import (
    UNEXPECTED_ADMISSION_ERROR,
    MemoryPodSource,
    PodState,
    SimKubelet,
    pod_manifest,
)
from tests_support.kubelet import (
    DEADLINE,
    RESOURCE,
    FakePlugin,
    healthy,
    last_report,
    running,
    short_tmpdir,
)

pb = deviceplugin_pb2


async def test_registration_dials_back_and_keeps_the_device_list() -> None:
    options = pb.DevicePluginOptions(get_preferred_allocation_available=True)
    async with running(healthy("d0", "d1"), options=options) as h:
        assert [r.resource_name for r in h.kubelet.registrations] == [RESOURCE]
        assert h.kubelet.options(RESOURCE) == options
        assert h.kubelet.free(RESOURCE) == ["d0", "d1"]


async def test_list_and_watch_updates_replace_the_list() -> None:
    async with running(healthy("d0", "d1")) as h:
        h.plugin.set_devices({"d0": UNHEALTHY, "d1": "Healthy", "d2": "Healthy"})
        await h.wait_devices({"d0": UNHEALTHY, "d1": "Healthy", "d2": "Healthy"})
        assert h.kubelet.free(RESOURCE) == ["d1", "d2"]


@pytest.mark.parametrize(
    ("version", "resource", "endpoint"),
    [
        ("v1alpha", RESOURCE, "fake.sock"),
        ("v1beta1", "cpu", "fake.sock"),
        ("v1beta1", "kubernetes.io/thing", "fake.sock"),
        ("v1beta1", RESOURCE, "../escape.sock"),
    ],
)
async def test_invalid_registration_is_refused(version: str, resource: str, endpoint: str) -> None:
    with short_tmpdir() as directory:
        async with SimKubelet(directory, MemoryPodSource()) as kubelet:
            plugin = FakePlugin(directory, healthy("d0"), resource=resource, endpoint=endpoint)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await plugin.register(version=version)
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert kubelet.registrations == []


async def test_unreachable_plugin_is_reported_not_kept() -> None:
    with short_tmpdir() as directory:
        async with SimKubelet(directory, MemoryPodSource(), connect_timeout=0.2) as kubelet:
            plugin = FakePlugin(directory, healthy("d0"))  # registers but never serves
            await plugin.register()
            await kubelet.wait_for(lambda: bool(kubelet.connect_errors), DEADLINE)
            assert kubelet.devices(RESOURCE) == {}


async def test_re_registration_replaces_the_old_stream() -> None:
    async with running(healthy("d0", "d1")) as h:
        successor = FakePlugin(h.plugin.directory, healthy("n0"), endpoint="successor.sock")
        await successor.serve()
        try:
            await successor.register()
            await h.wait_devices(healthy("n0"))
            # The replaced plugin is no longer listened to.
            h.plugin.set_devices(healthy("d0", "d1", "d2"))
            successor.set_devices(healthy("n0", "n1"))
            await h.wait_devices(healthy("n0", "n1"))
        finally:
            await successor.stop()


async def test_a_plugin_that_goes_away_leaves_its_devices_unhealthy() -> None:
    async with running(healthy("d0", "d1")) as h:
        await h.plugin.stop()
        await h.wait_devices({"d0": UNHEALTHY, "d1": UNHEALTHY})
        assert h.kubelet.free(RESOURCE) == []


async def test_restart_recreates_kubelet_sock_and_accepts_re_registration() -> None:
    async with running(healthy("d0", "d1")) as h:
        h.source.add(pod_manifest("p", "uid-p", {"main": {RESOURCE: 1}}))
        await h.wait_phase("uid-p", "Running")
        sock = h.kubelet.kubelet_socket
        old = h.directory / "old-kubelet.sock"
        os.link(sock, old)  # pins the old inode so a re-created socket cannot reuse it

        await h.kubelet.restart()

        assert sock.stat().st_ino != old.stat().st_ino
        assert not h.plugin.socket_path.exists()  # kubelet clears plugin sockets at start
        assert h.kubelet.devices(RESOURCE) == {}
        await h.plugin.stop()
        await h.plugin.serve()
        await h.plugin.register()
        await h.wait_devices(healthy("d0", "d1"))
        assert len(h.kubelet.registrations) == 2
        # Assignments survive the restart, as kubelet's checkpoint keeps them.
        record = h.kubelet.record("uid-p")
        assert record is not None and record.state is PodState.RUNNING
        assert h.kubelet.free(RESOURCE) == ["d1"]


async def test_restart_during_an_allocate_fails_that_pod_and_keeps_admitting() -> None:
    """Closing the plugin's channel cancels its calls (grpc.aio); the Pod whose Allocate was in
    flight fails admission, and the kubelet goes on with the next Pods (found by bench.chaos)."""
    async with running(healthy("d0", "d1")) as h:
        h.plugin.allocate_gate = asyncio.Event()
        h.source.add(pod_manifest("p", "uid-p", {"main": {RESOURCE: 1}}))
        await asyncio.wait_for(h.plugin.allocate_entered.wait(), 10)

        await h.kubelet.restart()

        await h.wait_phase("uid-p", "Failed")
        assert last_report(h.source, "uid-p").reason == UNEXPECTED_ADMISSION_ERROR
        h.plugin.allocate_gate.set()
        await h.plugin.stop()
        await h.plugin.serve()
        await h.plugin.register()
        await h.wait_devices(healthy("d0", "d1"))
        h.source.add(pod_manifest("q", "uid-q", {"main": {RESOURCE: 1}}))
        await h.wait_phase("uid-q", "Running")
        assert h.kubelet.sync_error is None
