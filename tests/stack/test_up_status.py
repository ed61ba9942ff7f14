"""`partkeeper up` in the background: `partkeeper status --json` agrees with the simulated
hardware, and SIGTERM stops every process the stack started."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch

from tests_support.stack import (
    READY_DEADLINE,
    STOP_DEADLINE,
    Up,
    recorded_children,
    run_cli,
    short_workdir,
    up_ready,
    wait_no_survivors,
)

pytestmark = [pytest.mark.stack, pytest.mark.timeout(READY_DEADLINE + 2 * STOP_DEADLINE + 120)]

NODE = "sim-node-0"
RESOURCE = "nvidia.com/mig-1g.10gb"
AGREE_DEADLINE = 30.0


@pytest.fixture
def up() -> Iterator[Up]:
    with up_ready() as running:
        yield running


def start_pod(kubeconfig: str, name: str) -> str:
    """Create a Pod bound to the node asking for one 1g.10gb partition; its UID once Running."""
    api = client.CoreV1Api(config.new_client_from_config(kubeconfig))
    body = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": NODE, "restartPolicy": "Never", "containers": [{
            "name": "main", "image": "busybox",
            "resources": {"limits": {RESOURCE: "1"}},
        }]},
    }
    api.create_namespaced_pod("default", body)
    stream = watch.Watch().stream(api.list_namespaced_pod, "default",
                                  field_selector=f"metadata.name={name}", timeout_seconds=60)
    for event in stream:
        pod = event["object"]
        if pod.status.phase == "Running":
            return str(pod.metadata.uid)
        assert pod.status.phase == "Pending", f"Pod {name} was not admitted: {pod.status}"
    raise AssertionError(f"Pod {name} not Running after 60s")


def hardware(sim: dict[str, Any]) -> dict[int, Any]:
    return {
        card["index"]: (card["uuid"], card["model"], card["mode"], sorted(
            (i["uuid"], i["profile"], i["start"], i["size"]) for i in card["instances"]))
        for card in sim["cards"]
    }


def reported(status: dict[str, Any]) -> dict[int, Any]:
    return {
        card["index"]: (card["uuid"], card["model"], card["mode"], sorted(
            (i["uuid"], i["profile"], i["start"], i["size"]) for i in card["instances"]))
        for card in status["cards"]
    }


def agreeing_status(env: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """status and sim list once they describe the same hardware (capacity lags by ~100 ms)."""
    end = time.monotonic() + AGREE_DEADLINE
    while True:
        sim = run_cli(["sim", "list", "--json"], env)
        status = run_cli(["status", "--json"], env)
        if reported(status) == hardware(sim) or time.monotonic() > end:
            return status, sim


def test_status_matches_the_simulated_hardware(up: Up) -> None:
    env = up.env()
    uid = start_pod(env["KUBECONFIG"], "status-check")
    carved = run_cli(["sim", "carve", "--card", "1", "--profile", "3g.40gb", "--json"], env)

    status, sim = agreeing_status(env)

    assert reported(status) == hardware(sim)
    assert status["node"] == NODE
    assert all(status["services"].values()), status["services"]
    instances = {i["uuid"]: i for card in status["cards"] for i in card["instances"]}
    ours = [i for i in instances.values() if i["claim"] and i["claim"]["pod_uid"] == uid]
    assert len(ours) == 1 and ours[0]["claim"]["state"] == "active", instances
    assert ours[0]["profile"] == "1g.10gb" and not ours[0]["foreign"]
    assert instances[carved["uuid"]]["foreign"] and instances[carved["uuid"]]["claim"] is None
    by_index = {card["index"]: card for card in status["cards"]}
    assert by_index[1]["free"]["3g.40gb"] == 1  # the carved one is counted occupied
    assert [c["mode"] for c in status["cards"]] == ["partition", "partition", "sliced"]

    # the env file `up` suggests sourcing finds this `partkeeper` with no venv active
    found = subprocess.run(["bash", "-c", f". {up.workdir / 'env'} && command -v partkeeper"],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                           timeout=30)
    assert found.stdout.strip() == str(Path(sys.executable).parent / "partkeeper"), found

    assert up.terminate() == 0, up.output()
    assert_nothing_left(up.workdir)


def test_sigterm_while_starting_leaves_nothing() -> None:
    with short_workdir() as workdir:
        running = Up(workdir)
        try:
            wait_for_child(workdir, "cluster")
            assert running.terminate() == 0, running.output()
        finally:
            running.kill()
        assert_nothing_left(workdir)


def test_sigterm_when_ready_stops_every_child(up: Up) -> None:
    children = recorded_children(up.workdir)
    assert set(children) == {"nats", "cluster", "watcher", "allocator", "reclaimer", "gc"}
    assert all(c["exit_status"] is None for c in children.values())
    assert up.terminate() == 0, up.output()
    assert "partkeeper up: stopped" in up.output()
    assert_nothing_left(up.workdir)


def test_a_bad_environment_is_refused_before_anything_starts() -> None:
    with short_workdir() as workdir:
        running = Up(workdir, env={"PK_SLICES_PER_CARD": "many"})
        rest, _ = running.proc.communicate(timeout=STOP_DEADLINE)
        assert running.proc.returncode == 1, rest
        assert "PK_SLICES_PER_CARD='many' is not a whole number" in rest


def wait_for_child(workdir: Path, name: str) -> None:
    """Until pids.json records the child (the supervisor writes it atomically), bounded."""
    end = time.monotonic() + READY_DEADLINE
    while time.monotonic() < end:
        if (workdir / "pids.json").exists() and name in recorded_children(workdir):
            return
        time.sleep(0.05)  # poll interval of a condition bounded by the deadline
    raise AssertionError(f"{name} not started after {READY_DEADLINE:.0f}s")


def assert_nothing_left(workdir: Path) -> None:
    children = recorded_children(workdir)
    assert all(c["exit_status"] is not None for c in children.values()), children
    left = wait_no_survivors([c["process_group"] for c in children.values()])
    assert not left, f"processes left behind: {left}"
