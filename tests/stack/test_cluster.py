"""`partkeeper sim cluster`: the API server, kubelet and cards of a node in one process."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from partkeeper_sim.cluster import ClusterError, ClusterPaths, advertised_url
from partkeeper_sim.driver import SimDriver, init_state
from tests_support.stack import STOP_DEADLINE, partkeeper, short_workdir

READY_DEADLINE = 60.0


def read_line(fd: int, deadline: float) -> bytes:
    """One line from a pipe, or what arrived before it closed; bounded by `deadline`."""
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while not data.endswith(b"\n"):
            if not selector.select(timeout=deadline):
                raise AssertionError(f"no readiness line after {deadline:.0f}s")
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data


def start_cluster(workdir: Path, *extra: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            partkeeper("sim", "cluster", "--workdir", str(workdir), "--kubelet-dir",
                       str(workdir / "kubelet"), "--notify-fd", str(write_fd), *extra),
            pass_fds=[write_fd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
    finally:
        os.close(write_fd)
    try:
        line = read_line(read_fd, READY_DEADLINE)
    finally:
        os.close(read_fd)
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=STOP_DEADLINE)
        raise AssertionError(f"the cluster stopped before it was ready: {err.decode()}")
    return proc, json.loads(line)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=STOP_DEADLINE)
    except subprocess.TimeoutExpired:
        # Its stderr ends with every thread's stack (lifecycle.stop_on_signals): show it whole.
        proc.kill()
        _, err = proc.communicate(timeout=STOP_DEADLINE)
        tail = err.decode(errors="replace")[-12000:]
        raise AssertionError(f"the cluster did not stop {STOP_DEADLINE:.0f}s after SIGTERM; "
                             f"its stderr ends:\n{tail}") from None
    return proc.returncode


def test_cluster_serves_what_the_services_read_and_stops_on_sigterm() -> None:
    with short_workdir() as workdir:
        proc, ready = start_cluster(workdir)
        try:
            kubelet = workdir / "kubelet"
            assert ready["node"] == "sim-node-0"
            assert ready["kubeconfig"] == str(workdir / "kubeconfig")
            assert ready["kubelet_socket"] == str(kubelet / "device-plugins" / "kubelet.sock")
            assert ready["pod_resources_socket"] == str(kubelet / "pod-resources/kubelet.sock")
            assert (kubelet / "device-plugins" / "kubelet.sock").is_socket()
            assert (kubelet / "pod-resources" / "kubelet.sock").is_socket()
            api = client.CoreV1Api(config.new_client_from_config(ready["kubeconfig"]))
            assert api.list_namespaced_pod("default").items == []
            cards = SimDriver(workdir / "sim.json").list()["cards"]
            assert [(c["model"], c["mode"]) for c in cards] == [
                ("H100-80GB", "partition"), ("H100-80GB", "partition"), ("A100-40GB", "sliced"),
            ]
        finally:
            assert stop(proc) == 0
        assert not (kubelet / "device-plugins" / "kubelet.sock").exists()


def test_cluster_keeps_existing_cards() -> None:
    with short_workdir() as workdir:
        init_state(workdir / "sim.json", ["A100-40GB"], [])
        carved = SimDriver(workdir / "sim.json").carve(0, "3g.20gb")
        proc, _ = start_cluster(workdir, "--cards", "H200-141GB")
        try:
            cards = SimDriver(workdir / "sim.json").list()["cards"]
            assert [c["model"] for c in cards] == ["A100-40GB"]
            assert [i["uuid"] for i in cards[0]["instances"]] == [carved.uuid]
        finally:
            assert stop(proc) == 0


def test_an_unknown_card_model_is_refused() -> None:
    with short_workdir() as workdir:
        done = subprocess.run(
            partkeeper("sim", "cluster", "--workdir", str(workdir), "--kubelet-dir",
                       str(workdir / "k"), "--cards", "Z80-1GB"),
            capture_output=True, text=True, timeout=STOP_DEADLINE, check=False,
        )
        assert done.returncode == 2
        assert "Z80-1GB" in done.stderr


@pytest.mark.parametrize(
    ("host", "port", "advertise", "expected"),
    [
        ("127.0.0.1", 6443, None, "http://127.0.0.1:6443"),
        ("0.0.0.0", 6443, "simcluster", "http://simcluster:6443"),
        ("::1", 80, None, "http://[::1]:80"),
        ("localhost", 1, None, "http://localhost:1"),
    ],
)
def test_advertised_url(host: str, port: int, advertise: str | None, expected: str) -> None:
    assert advertised_url(host, port, advertise) == expected


def test_a_wildcard_address_is_never_advertised() -> None:
    assert "0.0.0.0" not in advertised_url("0.0.0.0", 6443, None)
    assert "[::]" not in advertised_url("::", 6443, None)


def test_a_kubelet_dir_too_long_for_unix_sockets_is_refused() -> None:
    with pytest.raises(ClusterError, match="too long for unix sockets"):
        ClusterPaths(Path("/tmp/w"), Path("/tmp/" + "k" * 80)).check()
