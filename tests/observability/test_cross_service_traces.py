"""One trace per Pod lifecycle step across the services (docs/contract.md section 10), end to end.

The whole stack runs as processes (nats-server, the simulated cluster, the four services:
tests_support.rig) exporting to `otlp_receiver.OtlpReceiver`, a real OTLP/gRPC endpoint of
this test. A Pod asking for a MIG profile is admitted, then deleted; the admission's Allocate and
the reclaim must each arrive as one connected trace with spans from every service involved.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator

import pytest
from kubernetes.client.exceptions import ApiException

from partkeeper_sim.stack.kube import NAMESPACE, Kube
from partkeeper_sim.stack.launch import offered_resources
from tests_support import until
from tests_support.otlp_receiver import OtlpReceiver, ReceivedSpan, ancestry, orphans
from tests_support.rig import Rig, open_rig

ALLOCATOR, WATCHER = "partkeeper-allocator", "partkeeper-watcher"
RECLAIMER, CLUSTER = "partkeeper-reclaimer", "partkeeper-sim-cluster"
PROFILE = "1g.10gb"
DEADLINE = 20.0  # each wait; the stack's start has its own deadlines (partkeeper_sim.stack)
SPAN_KIND_SERVER, SPAN_KIND_CONSUMER, SPAN_KIND_PRODUCER = 2, 5, 4
CLAIM_ATTRIBUTES = ("pk.pod_uid", "pk.card", "pk.profile", "pk.claim_id")


@pytest.fixture
async def rig(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Rig]:
    """The stack, every process of it (the cluster too) exporting to `receiver`."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    async with open_rig() as started:
        yield started


def connected(spans: list[ReceivedSpan]) -> bool:
    return len(orphans(spans)) == 1 and orphans(spans)[0].parent_id is None


def named(spans: list[ReceivedSpan], service: str, name: str, uid: str | None = None
          ) -> list[ReceivedSpan]:
    return [s for s in spans if s.service == service and s.name == name
            and (uid is None or s.attributes.get("pk.pod_uid") == uid)]


def allocate_trace(receiver: OtlpReceiver, uid: str) -> list[ReceivedSpan] | None:
    """The Pod's Allocate trace once every span named below is in and the tree is whole."""
    for claim in named(receiver.spans, ALLOCATOR, "claim", uid):
        spans = receiver.trace(claim.trace_id)
        wanted = [named(spans, ALLOCATOR, "v1beta1.DevicePlugin/Allocate"),
                  named(spans, WATCHER, "serve pods-pending")]
        wanted += [named(spans, ALLOCATOR, n, uid) for n in ("create", "activate", "descriptor")]
        if all(wanted) and connected(spans):
            return spans
    return None


def reclaim_trace(receiver: OtlpReceiver, uid: str) -> list[ReceivedSpan] | None:
    for gone in named(receiver.spans, WATCHER, "watcher PodGone", uid):
        spans = receiver.trace(gone.trace_id)
        # Not `release`: the reconcile pass may have begun the job before the event joined it.
        wanted = [named(spans, RECLAIMER, n, uid) for n in ("destroy", "remove")]
        wanted.append(named(spans, ALLOCATOR, "capacity update", uid))
        if all(wanted) and connected(spans):
            return spans
    return None


async def admit(rig: Rig, kube: Kube, name: str) -> str:
    """Create a Pod asking for one PROFILE partition, bind it, wait until it runs; its UID."""
    resource = f"{rig.stack.config.resource_prefix}{PROFILE}"
    assert resource in offered_resources(rig.stack.config)
    uid = await kube.create(name, resource)
    await kube.bind(name)

    async def running() -> bool:
        resp = await asyncio.to_thread(kube.api.read_namespaced_pod, name, NAMESPACE,
                                       _preload_content=False)
        status = json.loads(resp.data).get("status") or {}
        assert status.get("phase") != "Failed", f"Pod {name} failed: {status}"
        return status.get("phase") == "Running"

    await until(running, f"Pod {name} Running", DEADLINE)
    return uid


async def delete_now(kube: Kube, name: str) -> None:
    """Delete with no grace period: the watcher sees the Pod gone (PodGone), not finished."""
    try:
        await asyncio.to_thread(kube.api.delete_namespaced_pod, name, NAMESPACE,
                                grace_period_seconds=0, _preload_content=False)
    except ApiException as exc:
        raise AssertionError(f"deleting Pod {name}: {exc}") from exc


def check_allocate(spans: list[ReceivedSpan], uid: str) -> None:
    (server,) = named(spans, ALLOCATOR, "v1beta1.DevicePlugin/Allocate")
    assert server.kind == SPAN_KIND_SERVER and server.attributes["rpc.grpc.status_code"] == 0
    (root,) = orphans(spans)
    assert (root.service, root.name) == (CLUSTER, "kubelet admit"), "kubelet's call joins"
    assert root.attributes["pk.pod_uid"] == uid
    (lookup,) = named(spans, ALLOCATOR, "pod lookup", uid)
    (pending,) = named(spans, WATCHER, "serve pods-pending")
    assert ancestry(pending, spans)[1] == lookup
    for name in ("claim", "create", "activate", "descriptor"):
        for span in named(spans, ALLOCATOR, name, uid):
            assert span.attributes["pk.profile"] == PROFILE
            assert all(a in span.attributes for a in CLAIM_ATTRIBUTES), span
            assert server in ancestry(span, spans), f"{name} is not under Allocate"
    (created,) = named(spans, ALLOCATOR, "create", uid)
    assert created.attributes["pk.instance_uuid"]


def check_reclaim(spans: list[ReceivedSpan], uid: str) -> None:
    (gone,) = named(spans, WATCHER, "watcher PodGone", uid)
    assert gone.kind == SPAN_KIND_PRODUCER and orphans(spans) == [gone]
    (destroy,) = named(spans, RECLAIMER, "destroy", uid)
    assert all(a in destroy.attributes for a in CLAIM_ATTRIBUTES)
    assert destroy.attributes["pk.instance_uuid"] and destroy.status_code != 2
    consumed = ancestry(destroy, spans)[1]
    assert (consumed.service, consumed.name) == (RECLAIMER, "consume PK_PODS")
    assert ancestry(destroy, spans)[-1] == gone
    (update,) = named(spans, ALLOCATOR, "capacity update", uid)
    assert update.kind == SPAN_KIND_CONSUMER and update.status_code != 2
    assert update.attributes["pk.claim_id"] == destroy.attributes["pk.claim_id"]
    chain = ancestry(update, spans)
    assert (chain[1].service, chain[1].name) == (RECLAIMER, "remove")
    assert chain[-1] == gone
    assert len({s.trace_id for s in spans}) == 1


async def test_an_allocate_and_a_reclaim_are_each_one_trace_across_the_services(
    rig: Rig, receiver: OtlpReceiver
) -> None:
    kube = Kube(rig.stack.kubeconfig, rig.stack.node)
    try:
        uid = await admit(rig, kube, "traced-0")
        spans = await receiver.wait_until(lambda: allocate_trace(receiver, uid), DEADLINE,
                                          f"the Allocate trace of Pod {uid}")
        check_allocate(spans, uid)

        await delete_now(kube, "traced-0")
        spans = await receiver.wait_until(lambda: reclaim_trace(receiver, uid), DEADLINE,
                                          f"the reclaim trace of Pod {uid}")
        check_reclaim(spans, uid)
    finally:
        kube.close()
