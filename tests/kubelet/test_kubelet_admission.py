"""Admission, Allocate, PreStartContainer and freeing in the simulated kubelet."""

from __future__ import annotations

import asyncio
from pathlib import Path

from partkeeper.kubelet import HEALTHY, UNHEALTHY, deviceplugin_pb2
from partkeeper_sim.kubelet import (
    CREATE_CONTAINER_ERROR,
    UNEXPECTED_ADMISSION_ERROR,
    PodState,
    pod_manifest,
)
from partkeeper_sim.kubelet.runtime import device_error
from tests_support.kubelet import (
    DEADLINE,
    RESOURCE,
    Harness,
    healthy,
    is_state,
    last_report,
    pod_record,
    running,
    source_pod,
    state,
)

pb = deviceplugin_pb2
OTHER = "example.com/mig-2g.20gb"


def add_pod(h: Harness, name: str, count: int = 1, resource: str = RESOURCE) -> str:
    uid = f"uid-{name}"
    h.source.add(pod_manifest(name, uid, {"main": {resource: count}}))
    return uid


async def test_admission_allocates_the_lowest_free_ids_and_keeps_the_response() -> None:
    async with running(healthy("dev-10", "dev-2", "dev-1")) as h:
        uid = add_pod(h, "a", 2)
        await h.wait_phase(uid, "Running")
        assert h.plugin.allocated_ids() == [["dev-1", "dev-2"]]
        assert all(len(r.container_requests) == 1 for r in h.plugin.allocate_calls)
        container = pod_record(h.kubelet, uid).containers["main"]
        assert container.devices == {RESOURCE: ("dev-1", "dev-2")}
        response = container.responses[RESOURCE]
        assert dict(response.envs) == {"FAKE_VISIBLE_DEVICES": "dev-1,dev-2"}
        assert [m.container_path for m in response.mounts] == ["/fake"]
        assert [d.container_path for d in response.devices] == ["/dev/dev-1", "/dev/dev-2"]
        assert h.kubelet.free(RESOURCE) == ["dev-10"]


async def test_one_allocate_per_container_and_resource() -> None:
    async with running(healthy("d0", "d1", "d2")) as h:
        h.source.add(
            pod_manifest("multi", "uid-multi", {"first": {RESOURCE: 1}, "second": {RESOURCE: 2}})
        )
        await h.wait_phase("uid-multi", "Running")
        assert h.plugin.allocated_ids() == [["d0"], ["d1", "d2"]]
        containers = pod_record(h.kubelet, "uid-multi").containers
        assert containers["first"].devices == {RESOURCE: ("d0",)}
        assert containers["second"].devices == {RESOURCE: ("d1", "d2")}


async def test_preferred_allocation_is_asked_and_followed() -> None:
    options = pb.DevicePluginOptions(get_preferred_allocation_available=True)
    async with running(healthy("d0", "d1", "d2"), options=options) as h:
        h.plugin.preferred_answer = ["d2", "unknown"]
        uid = add_pod(h, "a", 2)
        await h.wait_phase(uid, "Running")
        request = h.plugin.preferred_calls[0].container_requests[0]
        assert list(request.available_deviceIDs) == ["d0", "d1", "d2"]
        assert request.allocation_size == 2
        # The preference is advice: unknown IDs are dropped and the rest filled lowest first.
        assert h.plugin.allocated_ids() == [["d2", "d0"]]


async def test_unhealthy_devices_are_not_admitted() -> None:
    async with running({"d0": UNHEALTHY, "d1": HEALTHY}) as h:
        uid = add_pod(h, "a", 2)
        await h.wait_phase(uid, "Failed")
        report = last_report(h.source, uid)
        assert report.reason == f"OutOf{RESOURCE}"
        assert "requested: 2, used: 0, capacity: 1" in report.message
        assert h.plugin.allocate_calls == []
        assert state(h, uid) is PodState.REJECTED


async def test_devices_held_by_a_running_pod_are_not_admitted() -> None:
    async with running(healthy("d0", "d1")) as h:
        first = add_pod(h, "first", 2)
        await h.wait_phase(first, "Running")
        second = add_pod(h, "second", 1)
        await h.wait_phase(second, "Failed")
        assert last_report(h.source, second).reason == f"OutOf{RESOURCE}"
        assert h.plugin.allocated_ids() == [["d0", "d1"]]


async def test_unregistered_resource_is_out_of_resource() -> None:
    async with running(healthy("d0")) as h:
        uid = add_pod(h, "a", 1, resource=OTHER)
        await h.wait_phase(uid, "Failed")
        assert last_report(h.source, uid).reason == f"OutOf{OTHER}"


async def test_allocate_error_fails_the_pod_with_unexpected_admission_error() -> None:
    async with running(healthy("d0", "d1")) as h:
        h.plugin.allocate_error = "card 0 has no room for 1g.10gb"
        uid = add_pod(h, "a", 1)
        await h.wait_phase(uid, "Failed")
        report = last_report(h.source, uid)
        assert report.reason == UNEXPECTED_ADMISSION_ERROR
        assert "card 0 has no room for 1g.10gb" in report.message
        assert state(h, uid) is PodState.REJECTED
        assert h.kubelet.free(RESOURCE) == ["d0", "d1"]
        # The kubelet keeps going: the next Pod is admitted once the plugin answers again.
        h.plugin.allocate_error = None
        second = add_pod(h, "b", 1)
        await h.wait_phase(second, "Running")


async def test_pods_without_device_requests_run_without_plugin_calls() -> None:
    async with running(healthy("d0")) as h:
        h.source.add(pod_manifest("plain", "uid-plain", {"main": {}}))
        await h.wait_phase("uid-plain", "Running")
        assert h.plugin.allocate_calls == []


async def test_pre_start_is_called_when_the_plugin_asks() -> None:
    options = pb.DevicePluginOptions(pre_start_required=True)
    async with running(healthy("d0", "d1"), options=options) as h:
        uid = add_pod(h, "a", 1)
        await h.wait_phase(uid, "Running")
        assert h.plugin.pre_start_calls == [["d0"]]

        h.plugin.pre_start_error = "device reset failed"
        second = add_pod(h, "b", 1)
        await h.wait_phase(second, "Pending")
        report = last_report(h.source, second)
        assert report.reason == CREATE_CONTAINER_ERROR
        assert "device reset failed" in report.message
        assert state(h, second) is PodState.START_FAILED
        assert h.kubelet.free(RESOURCE) == []  # kubelet keeps the devices of an admitted Pod


async def test_a_device_spec_naming_a_missing_host_path_fails_the_container(
    tmp_path: Path,
) -> None:
    """containerd resolves every device spec's host path before the container exists; a missing
    one (a MIG capability node nothing made yet) fails CreateContainer, the Pod stays Pending
    with its devices, and a node made later lets the next Pod start."""
    async with running(healthy("d0", "d1")) as h:
        h.plugin.host_path = lambda device: str(tmp_path / f"nvidia-cap-{device}")
        uid = add_pod(h, "a", 1)
        await h.wait_phase(uid, "Pending")
        report = last_report(h.source, uid)
        assert report.reason == CREATE_CONTAINER_ERROR
        missing = tmp_path / "nvidia-cap-d0"
        assert report.message == (f"container main: failed to generate container spec: device "
                                  f"/dev/d0: lstat {missing}: no such file or directory")
        assert state(h, uid) is PodState.START_FAILED
        assert h.kubelet.free(RESOURCE) == ["d1"]  # kubelet keeps the devices of an admitted Pod

        (tmp_path / "nvidia-cap-d1").write_text("a regular file")  # exists, but no device
        second = add_pod(h, "b", 1)
        await h.wait_phase(second, "Pending")
        assert last_report(h.source, second).message.endswith(
            f"{tmp_path / 'nvidia-cap-d1'}: not a device node")


def test_the_runtime_takes_character_devices_and_follows_links(tmp_path: Path) -> None:
    (tmp_path / "null").symlink_to("/dev/null")
    assert device_error(str(tmp_path / "null")) is None
    assert device_error("/dev/null") is None
    assert device_error(str(tmp_path)) == f"{tmp_path}: not a device node"
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    dangling = device_error(str(tmp_path / "dangling"))
    assert dangling is not None and dangling.startswith(f"lstat {tmp_path / 'dangling'}: ")


async def test_deleted_pod_frees_its_devices_before_it_is_finalized() -> None:
    async with running(healthy("d0")) as h:
        old = add_pod(h, "old", 1)
        await h.wait_phase(old, "Running")
        h.source.request_delete(old)
        await h.source.wait_for(lambda: old in h.source.finalized, DEADLINE)
        assert last_report(h.source, old).phase == "Succeeded"
        assert h.source.pod(old) is None
        # The successor gets the same device at once: the race partkeeper must survive.
        new = add_pod(h, "new", 1)
        await h.wait_phase(new, "Running")
        assert h.plugin.allocated_ids() == [["d0"], ["d0"]]


async def test_finished_pod_frees_its_devices() -> None:
    async with running(healthy("d0")) as h:
        uid = add_pod(h, "job", 1)
        await h.wait_phase(uid, "Running")
        await h.kubelet.finish(uid, "Failed", "Error", "exit code 1")
        assert h.kubelet.free(RESOURCE) == ["d0"]
        assert last_report(h.source, uid).reason == "Error"
        assert source_pod(h.source, uid).phase == "Failed"
        # Deleting a finished Pod only removes the object.
        h.source.request_delete(uid)
        await h.source.wait_for(lambda: h.source.pod(uid) is None, DEADLINE)
        assert [r.phase for r in h.source.reports[uid]] == ["Running", "Failed"]


async def test_phase_set_elsewhere_frees_the_devices() -> None:
    async with running(healthy("d0")) as h:
        uid = add_pod(h, "a", 1)
        await h.wait_phase(uid, "Running")
        await h.source.set_phase(uid, "Succeeded", "", "")  # as another writer would
        await h.kubelet.wait_for(lambda: h.kubelet.free(RESOURCE) == ["d0"], DEADLINE)


async def test_terminating_pod_keeps_devices_until_its_containers_stop() -> None:
    async with running(healthy("d0"), termination_delay=3600) as h:
        uid = add_pod(h, "slow", 1)
        await h.wait_phase(uid, "Running")
        h.source.request_delete(uid)
        await h.kubelet.wait_for(lambda: is_state(h, uid, PodState.TERMINATING), DEADLINE)
        blocked = add_pod(h, "blocked", 1)
        await h.wait_phase(blocked, "Failed")
        assert h.kubelet.free(RESOURCE) == []
        # A force delete stops the grace period at once.
        h.source.force_delete(uid)
        await h.kubelet.wait_for(lambda: h.kubelet.free(RESOURCE) == ["d0"], DEADLINE)
        assert pod_record(h.kubelet, uid).gone


async def test_pending_pod_deleted_before_admission_is_only_finalized() -> None:
    async with running(healthy("d0")) as h:
        manifest = pod_manifest("late", "uid-late", {"main": {RESOURCE: 1}})
        manifest["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
        h.source.add(manifest)
        await h.source.wait_for(lambda: "uid-late" in h.source.finalized, DEADLINE)
        assert h.plugin.allocate_calls == []


async def test_allocate_in_flight_blocks_later_admissions() -> None:
    async with running(healthy("d0", "d1")) as h:
        h.plugin.allocate_gate = asyncio.Event()
        first = add_pod(h, "first", 1)
        await asyncio.wait_for(h.plugin.allocate_entered.wait(), DEADLINE)
        second = add_pod(h, "second", 1)
        assert h.kubelet.free(RESOURCE) == ["d1"]  # chosen for the Allocate in flight
        assert h.kubelet.record(second) is None  # the sync loop is busy with the first
        h.plugin.allocate_gate.set()
        await h.wait_phase(second, "Running")
        assert h.plugin.allocated_ids() == [["d0"], ["d1"]]
        assert last_report(h.source, first).phase == "Running"


# -- behaviour of a real kubelet the allocator must survive (docs/kubelet.md) ---------------


async def test_devices_are_free_when_containers_stop_while_the_status_lags() -> None:
    async with running(healthy("d0")) as h:
        uid = add_pod(h, "a")
        await h.wait_phase(uid, "Running")
        h.kubelet.status_lag = 0.3
        await h.kubelet.finish(uid)
        assert h.kubelet.free(RESOURCE) == ["d0"]  # at once
        assert last_report(h.source, uid).phase == "Running"  # the API server still says so
        b = add_pod(h, "b")
        await h.kubelet.wait_for(lambda: is_state(h, b, PodState.RUNNING), DEADLINE)
        assert pod_record(h.kubelet, b).containers["main"].devices == {RESOURCE: ("d0",)}
        await h.wait_phase(uid, "Succeeded")  # the API server hears later


async def test_a_pod_that_does_not_fit_is_rejected_before_any_allocate() -> None:
    async with running(healthy("d0", "d1"), cpu_millis=1000, status_lag=0.2) as h:
        uid = "uid-big"
        h.source.add(pod_manifest("big", uid, {"main": {RESOURCE: 1}}, cpu="2"))
        await h.kubelet.wait_for(lambda: is_state(h, uid, PodState.REJECTED), DEADLINE)
        assert h.plugin.allocate_calls == []
        assert h.kubelet.free(RESOURCE) == ["d0", "d1"]
        assert h.source.last_report(uid) is None  # still Pending on the API server
        await h.wait_phase(uid, "Failed")
        assert last_report(h.source, uid).reason == "OutOfcpu"


async def test_init_container_devices_are_reused_by_the_app_container() -> None:
    """kubelet's device manager hands an init container's devices on to the containers after
    it and calls Allocate again for them with the same IDs."""
    async with running(healthy("d0", "d1", "d2")) as h:
        h.source.add(pod_manifest("a", "uid-a", {"main": {RESOURCE: 2}},
                                  init={"setup": {RESOURCE: 1}}))
        await h.wait_phase("uid-a", "Running")
        assert h.plugin.allocated_ids() == [["d0"], ["d0", "d1"]]
        assert h.kubelet.free(RESOURCE) == ["d2"]
        containers = pod_record(h.kubelet, "uid-a").containers
        assert containers["setup"].devices == {RESOURCE: ("d0",)}
        assert containers["main"].devices == {RESOURCE: ("d0", "d1")}


async def test_pods_are_admitted_in_binding_order_not_creation_order() -> None:
    async with running(healthy("d0", "d1")) as h:
        late = pod_manifest("late", "uid-late", {"main": {RESOURCE: 1}})
        early = pod_manifest("early", "uid-early", {"main": {RESOURCE: 1}})
        late["metadata"]["creationTimestamp"] = "2026-01-01T00:00:02Z"
        early["metadata"]["creationTimestamp"] = "2026-01-01T00:00:01Z"
        h.source.add(late)  # bound first, though created later
        h.source.add(early)
        await h.wait_phase("uid-early", "Running")
        assert pod_record(h.kubelet, "uid-late").containers["main"].devices == {RESOURCE: ("d0",)}
        assert pod_record(h.kubelet, "uid-early").containers["main"].devices == {RESOURCE: ("d1",)}
