"""compose/docker-compose.yml brought up from nothing with podman, and checked through its
containers: the published ports, `podman exec`, `podman inspect` and what reaches the OTLP
receiver standing in Jaeger's place. The file is the one users run; the test lays over it only
compose.stand-ins.yml (the receiver), and the base images are made locally under their own names
(tests/containers/README.md says what stands in for what, and why).

One stack for the module, started by the `stack` fixture; the tests run in file order against it
and the last one takes it down. The traces are checked before the services are killed: a span
still in a killed process's export buffer is lost with it.

The scenario is the demo's in short: two Pods fill both H100s' 7g.80gb partitions and one takes
a logical slice of the sliced A100; one of the H100 Pods and the sliced one are deleted and
reclaimed; a third Pod takes the freed card.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from partkeeper_sim.stack.kube import NAMESPACE, Kube
from tests_support import until
from tests_support.containers import (
    COMPOSE_FILE,
    Compose,
    podman,
    proc_environ,
    proc_status,
)

pytestmark = [pytest.mark.containers, pytest.mark.timeout(900)]

NODE = "sim-node-0"  # compose's PK_NODE_NAME
SERVICES = ("watcher", "allocator", "reclaimer", "gc")
SERVICE_NAMES = {f"partkeeper-{s}" for s in SERVICES}  # their OTEL_SERVICE_NAME
WHOLE, SLICE = "nvidia.com/mig-7g.80gb", "nvidia.com/gpu.sliced"
DEADLINE = 60.0  # each wait on the stack: a bound on a loaded two-core machine


@dataclass
class Scenario:
    """What the scenario did, for the tests that check what it left behind."""

    uids: dict[str, str] = field(default_factory=dict)  # Pod name -> UID
    card_of: dict[str, int] = field(default_factory=dict)  # Pod name -> card index
    deleted: list[str] = field(default_factory=list)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)  # step -> status --json


def published(compose: Compose, service: str, port: int) -> int:
    """The host port compose publishes the service's `port` on."""
    for mapping in compose.service(service).get("ports", []):
        host, _, inside = str(mapping).rpartition(":")
        if int(inside) == port:
            return int(host)
    raise AssertionError(f"{service} publishes no port {port}")


def admin_credentials() -> tuple[str, str]:
    """The operators' user of compose/nats/nats.conf, which `partkeeper status` connects as."""
    text = (COMPOSE_FILE.parent / "nats" / "nats.conf").read_text()
    found = re.search(r'\{user: "(pk-admin)", password: "([^"]+)"', text)
    assert found, "compose/nats/nats.conf has no pk-admin user"
    return found.group(1), found.group(2)


def host_status(compose: Compose, *args: str) -> subprocess.CompletedProcess[str]:
    """`partkeeper status` run on the host, against the published NATS port, as an operator."""
    user, password = admin_credentials()
    env = {"NATS_URL": f"nats://127.0.0.1:{published(compose, 'nats', 4222)}",
           "NATS_USER": user, "NATS_PASSWORD": password, "PK_NODE_NAME": NODE,
           "PATH": str(Path(sys.executable).parent)}
    return subprocess.run(["partkeeper", "status", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def status(compose: Compose) -> dict[str, Any]:
    result = host_status(compose, "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def claims_of(doc: dict[str, Any], uid: str) -> list[tuple[int, dict[str, Any]]]:
    return [(card["index"], claim) for card in doc["cards"] for claim in card["claims"]
            if claim["pod_uid"] == uid]


def host_kubeconfig(compose: Compose, directory: Path) -> Path:
    """The simulated cluster's kubeconfig, read from its container, pointed at the published
    API server port."""
    text = compose.exec("simcluster", "cat", "/var/lib/partkeeper/kubeconfig").stdout
    config = json.loads(text)
    port = published(compose, "simcluster", 6443)
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"http://127.0.0.1:{port}"
    path = directory / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


def ports_free(compose: Compose) -> None:
    for service, spec in compose.config["services"].items():
        for mapping in spec.get("ports", []):
            port = int(str(mapping).split(":")[0])
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    pytest.fail(f"port {port} (compose's {service}) is taken on this machine: "
                                "the compose file publishes it; free it and run again")


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pk-compose-") as name:
        path = Path(name)
        (path / "otlp").mkdir()
        (path / "otlp").chmod(0o777)
        yield path


@pytest.fixture(scope="module")
def stack(sim_image: str, workdir: Path) -> Iterator[Compose]:
    compose = Compose(workdir / "otlp")
    compose.down()  # what an interrupted earlier run left
    assert compose.containers() == []
    ports_free(compose)
    started = time.monotonic()
    try:
        compose.up()
        print(f"compose up: {time.monotonic() - started:.0f} s")
        yield compose
    finally:
        compose.down()


@pytest.fixture(scope="module")
def kube(stack: Compose, workdir: Path) -> Iterator[Kube]:
    client = Kube(host_kubeconfig(stack, workdir), NODE)
    yield client
    client.close()


async def phase(kube: Kube, name: str) -> str:
    resp = await asyncio.to_thread(kube.api.read_namespaced_pod, name, NAMESPACE,
                                   _preload_content=False)
    pod_status = json.loads(resp.data).get("status") or {}
    assert pod_status.get("phase") != "Failed", f"Pod {name} failed: {pod_status}"
    return str(pod_status.get("phase"))


async def admit(kube: Kube, compose: Compose, name: str, resource: str) -> tuple[str, int]:
    """Create and bind a Pod, wait until it runs and its claim is active; (UID, card)."""
    uid = await kube.create(name, resource)
    await kube.bind(name)
    await until(lambda: _running(kube, name), f"Pod {name} Running", DEADLINE)
    found: list[int] = []

    def active() -> bool:
        found[:] = [card for card, claim in claims_of(status(compose), uid)
                    if claim["state"] == "active"]
        return bool(found)

    await until(active, f"an active claim of Pod {name} in partkeeper status", DEADLINE)
    return uid, found[0]


async def _running(kube: Kube, name: str) -> bool:
    return await phase(kube, name) == "Running"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scenario(stack: Compose, kube: Kube) -> Scenario:
    done = Scenario()
    for name, resource in (("whole-a", WHOLE), ("whole-b", WHOLE), ("slice-s", SLICE)):
        done.uids[name], done.card_of[name] = await admit(kube, stack, name, resource)
    done.statuses["full"] = status(stack)

    for name in ("whole-a", "slice-s"):
        await kube.delete(name)
        done.deleted.append(name)

    def reclaimed() -> bool:
        doc = status(stack)
        done.statuses["reclaimed"] = doc
        return not any(claims_of(doc, done.uids[n]) for n in done.deleted)

    await until(reclaimed, "the deleted Pods' claims released", DEADLINE)
    done.uids["whole-c"], done.card_of["whole-c"] = await admit(kube, stack, "whole-c", WHOLE)
    done.statuses["refilled"] = status(stack)
    return done


def free(doc: dict[str, Any], card: int, profile: str) -> int:
    [found] = [c for c in doc["cards"] if c["index"] == card]
    return int(found["free"].get(profile, 0))


# -- the tests, in the order they run against the one stack -----------------------------------


def test_provisioning_ran_once_and_every_service_became_ready(stack: Compose) -> None:
    provision = stack.inspect("provision")
    assert provision["State"]["Status"] == "exited"
    assert provision["State"]["ExitCode"] == 0
    assert provision["RestartCount"] == 0
    assert stack.logs("provision").count("ready with 1 replica(s)") == 1
    for service, spec in stack.config["services"].items():
        if "healthcheck" in spec:
            stack.healthy(service)
    for service in SERVICES:
        assert stack.inspect(service)["RestartCount"] == 0, stack.logs(service)[-3000:]


def test_each_service_runs_as_its_user_with_its_credentials(stack: Compose) -> None:
    monitor = published(stack, "nats", 8222)
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz?auth=1&limit=1024",
                                timeout=10) as resp:
        connections = json.load(resp)["connections"]
    for service in SERVICES:
        spec = stack.service(service)
        uid = proc_status(stack, service)["Uid"].split()
        assert uid == [str(spec["user"])] * 4, f"{service} runs as {uid}"
        env = proc_environ(stack, service)
        for name in ("NATS_USER", "NATS_PASSWORD", "NATS_URL", "PK_NODE_NAME"):
            assert env[name] == str(spec["environment"][name]), (service, name)
        users = {c.get("authorized_user") for c in connections
                 if c.get("name") == f"partkeeper-{service}-{NODE}"}
        assert users == {spec["environment"]["NATS_USER"]}, (service, users)


def test_the_node_admits_reclaims_and_refills(scenario: Scenario) -> None:
    full = scenario.statuses["full"]
    whole = {scenario.card_of["whole-a"], scenario.card_of["whole-b"]}
    assert len(whole) == 2, "the two 7g.80gb Pods take one H100 each"
    assert all(free(full, card, "7g.80gb") == 0 for card in whole)
    reclaimed = scenario.statuses["reclaimed"]
    assert free(reclaimed, scenario.card_of["whole-a"], "7g.80gb") == 1
    assert not claims_of(reclaimed, scenario.uids["slice-s"])
    refilled = scenario.statuses["refilled"]
    assert scenario.card_of["whole-c"] == scenario.card_of["whole-a"]
    assert all(free(refilled, card, "7g.80gb") == 0 for card in whole)


def spans(stack: Compose) -> list[dict[str, Any]]:
    path = stack.otlp_out / "spans.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def traces_with(received: list[dict[str, Any]], match: Callable[[dict[str, Any]], bool],
                ) -> dict[str, list[dict[str, Any]]]:
    """The traces (id -> spans) that hold a span matching `match`."""
    ids = {s["trace_id"] for s in received if match(s)}
    return {tid: [s for s in received if s["trace_id"] == tid] for tid in ids}


def connected(trace: list[dict[str, Any]]) -> bool:
    ids = {s["span_id"] for s in trace}
    return len([s for s in trace if s["parent_id"] not in ids]) == 1


def services_in(trace: list[dict[str, Any]]) -> set[str]:
    return {s["service"] for s in trace}


async def test_one_trace_per_allocate_and_per_reclaim_with_the_four_services(
    stack: Compose, scenario: Scenario
) -> None:
    def allocate(uid: str) -> Callable[[dict[str, Any]], bool]:
        return lambda s: s["name"] == "claim" and s["attributes"].get("pk.pod_uid") == uid

    def reclaim(uid: str) -> Callable[[dict[str, Any]], bool]:
        return lambda s: (s["name"] == "watcher PodGone"
                          and s["attributes"].get("pk.pod_uid") == uid)

    wanted = [(f"Allocate of {n}", allocate(uid), {"partkeeper-allocator", "partkeeper-watcher"})
              for n, uid in scenario.uids.items()]
    # The reclaimer and the GC both consume the watcher's PodGone, so each reclaim's trace holds
    # all three; each service exports on its own schedule, so the wait is for the last of them.
    wanted += [(f"reclaim of {n}", reclaim(scenario.uids[n]),
                {"partkeeper-watcher", "partkeeper-reclaimer", "partkeeper-gc"})
               for n in scenario.deleted]
    found: dict[int, list[dict[str, Any]]] = {}
    seen_so_far: list[str] = []

    def arrived() -> bool:
        received = spans(stack)
        seen_so_far.clear()
        for i, (what, match, services) in enumerate(wanted):
            traces = traces_with(received, match)
            seen_so_far.append(f"{what}: {len(traces)} trace(s) "
                               + "; ".join(f"{sorted(services_in(t))} connected={connected(t)}"
                                           for t in traces.values()))
            found.pop(i, None)
            if len(traces) == 1:
                [trace] = traces.values()
                if services <= services_in(trace) and connected(trace):
                    found[i] = trace
        return len(found) == len(wanted)

    try:
        await until(arrived, "one connected trace per Allocate and per reclaim", DEADLINE)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n" + "\n".join(seen_so_far)) from None
    for what, match, _ in wanted:
        assert len(traces_with(spans(stack), match)) == 1, f"{what}: one trace, not more"
    seen = set().union(*(services_in(t) for t in found.values()))
    assert seen >= SERVICE_NAMES, f"spans from {sorted(seen)}"


def test_status_works_from_the_host(stack: Compose, scenario: Scenario) -> None:
    result = host_status(stack)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first == f"node {NODE}" or first.startswith(f"node {NODE} "), first
    for name in ("whole-b", "whole-c"):
        assert scenario.uids[name] in result.stdout


async def test_a_killed_service_restarts_and_loses_nothing(
    stack: Compose, kube: Kube, scenario: Scenario
) -> None:
    """Each crashes (SIGKILL to its process from outside, as the kernel's OOM killer ends one):
    compose's restart policy starts it again, and the claims and partitions are as they were.
    (`podman kill` counts as stopped by the user: no restart.)"""
    before = status(stack)
    for service in ("allocator", "reclaimer"):
        found = stack.inspect(service)
        restarts = found["RestartCount"]
        os.kill(found["State"]["Pid"], signal.SIGKILL)

        def restarted(service: str = service, restarts: int = restarts) -> bool:
            found = stack.inspect(service)
            return found["RestartCount"] > restarts and found["State"]["Status"] == "running"

        await until(restarted, f"{service} restarted by its restart policy", DEADLINE)
        await asyncio.to_thread(stack.healthy, service)
    after = status(stack)
    assert [c["claims"] for c in after["cards"]] == [c["claims"] for c in before["cards"]]
    assert [c["instances"] for c in after["cards"]] == [c["instances"] for c in before["cards"]]
    # and the restarted services still reclaim and allocate
    await kube.delete("whole-b")
    scenario.deleted.append("whole-b")
    await until(lambda: not claims_of(status(stack), scenario.uids["whole-b"]),
                "whole-b's claim released after the restarts", DEADLINE)
    scenario.uids["whole-d"], _ = await admit(kube, stack, "whole-d", WHOLE)


def test_down_leaves_no_container_running(stack: Compose) -> None:
    result = stack.down()
    assert result.returncode == 0, result.stdout + result.stderr
    assert stack.containers(running_only=True) == []
    assert stack.containers() == []
    volumes = podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
    assert not [v for v in volumes if v.startswith(f"{stack.project}_")]
