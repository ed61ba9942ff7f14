"""The demo's Kubernetes side, through the real `kubernetes` client: Pods, binding, a Pod watch.

The client is synchronous: calls run in worker threads (`asyncio.to_thread`), and the Pod watch
is `partkeeper.listwatch.ListWatch` (the one the watcher and the simulated kubelet use), each
event stamped with the time it arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from partkeeper.listwatch import EndedAtOnce, Event, Expired, Listed, ListWatch, WatchFailed

log = logging.getLogger(__name__)

NAMESPACE = "partkeeper-demo"
WATCH_SECONDS = 5  # each watch request ends this often, so the thread notices it should stop
STOP_SECONDS = 2.0  # how long a stopped watch thread may take to leave the client


@dataclass(frozen=True, slots=True)
class PodChange:
    """One watch event: `kind` ADDED/MODIFIED/DELETED, or LISTED for a (re)list."""

    kind: str
    name: str
    uid: str
    phase: str
    reason: str
    message: str
    at: float  # time.monotonic() when it arrived


def pod_body(name: str, resource: str, count: int) -> dict[str, Any]:
    """A Pod with one container asking for `count` of `resource`, not yet bound to a node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {"app.kubernetes.io/part-of": "partkeeper-demo"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": "busybox",
                "command": ["sleep", "infinity"],
                "resources": {"limits": {resource: str(count)},
                              "requests": {resource: str(count)}},
            }],
        },
    }


class Kube:
    def __init__(self, kubeconfig: Path, node: str) -> None:
        self.api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
        self.node = node

    def close(self) -> None:
        self.api.api_client.close()

    async def create(self, name: str, resource: str, count: int = 1) -> str:
        """Create the Pod; returns its UID."""
        body = pod_body(name, resource, count)
        resp = await asyncio.to_thread(
            self.api.create_namespaced_pod, NAMESPACE, body, _preload_content=False
        )
        return str(json.loads(resp.data)["metadata"]["uid"])

    async def bind(self, name: str) -> None:
        """What a scheduler does: bind the Pod to the node (the kubelet then admits it)."""
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node),
        )
        # The answer is a Status the client cannot read as a V1Binding (docs/sim-apiserver.md).
        await asyncio.to_thread(
            self.api.create_namespaced_pod_binding, name, NAMESPACE, binding,
            _preload_content=False,
        )

    async def annotations(self) -> dict[str, str]:
        """The node's annotations."""
        resp = await asyncio.to_thread(self.api.read_node, self.node, _preload_content=False)
        found: dict[str, str] = json.loads(resp.data)["metadata"].get("annotations") or {}
        return found

    async def warnings(self, reason: str) -> list[dict[str, Any]]:
        """The Warning Events of the demo's namespace with `reason` (as `kubectl get events`)."""
        resp = await asyncio.to_thread(
            self.api.list_namespaced_event, NAMESPACE,
            field_selector=f"reason={reason}", _preload_content=False,
        )
        return [e for e in json.loads(resp.data).get("items") or [] if e.get("type") == "Warning"]

    async def resource_health(self, name: str) -> list[dict[str, Any]]:
        """The Pod's `status.containerStatuses[].allocatedResourcesStatus` entries, as
        `kubectl get pod -o yaml` shows them (empty for a Pod that is gone)."""
        return await resource_health(self.api, name, NAMESPACE)

    async def delete(self, name: str) -> None:
        """A graceful delete, as `kubectl delete pod` does."""
        await asyncio.to_thread(
            self.api.delete_namespaced_pod, name, NAMESPACE, _preload_content=False
        )


async def resource_health(api: client.CoreV1Api, name: str, namespace: str
                          ) -> list[dict[str, Any]]:
    """A Pod's allocatedResourcesStatus entries, read raw from the API server; [] when gone."""
    try:
        resp = await asyncio.to_thread(api.read_namespaced_pod, name, namespace,
                                       _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
    statuses = (json.loads(resp.data).get("status") or {}).get("containerStatuses") or []
    return [e for s in statuses for e in s.get("allocatedResourcesStatus") or []]


def health_words(entries: list[dict[str, Any]]) -> set[str]:
    """Every device health word in `entries`."""
    return {str(r.get("health")) for e in entries for r in e.get("resources") or []}


def health_line(name: str, entries: list[dict[str, Any]]) -> str:
    """One line for the demo: what the Pod's status says of its devices."""
    shown = "; ".join(
        f"{e.get('name')} {r.get('resourceID')} {r.get('health')}"
        + (f" ({r['message']})" if r.get("message") else "")
        for e in entries for r in e.get("resources") or [])
    return f"{name} status.allocatedResourcesStatus: {shown or 'none'}"


class PodWatch:
    """Pods of the demo namespace as a stream of `PodChange`, delivered on the event loop."""

    def __init__(self, kube: Kube, deliver: Callable[[PodChange], None]) -> None:
        self._api = kube.api
        self._deliver = deliver
        self._listwatch: ListWatch[list[dict[str, Any]]] = ListWatch(
            self._list, self._watch_call, timeout_seconds=WATCH_SECONDS)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="demo pod watch")

    async def stop(self) -> None:
        self._listwatch.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for thread in list(self._listwatch.threads):  # out of the client before it is closed
            await asyncio.to_thread(thread.join, STOP_SECONDS)

    async def _run(self) -> None:
        while True:
            try:
                async with contextlib.aclosing(self._listwatch.items()) as items:
                    async for item in items:
                        self._hand(item)
            except Expired:
                continue  # list afresh at once
            except (WatchFailed, ApiException, HTTPError, OSError, EndedAtOnce) as exc:
                log.warning("demo Pod watch failed: %s; listing again", exc)
                self._listwatch.resume_from = None
                await asyncio.sleep(0.5)

    async def _list(self) -> tuple[str, list[dict[str, Any]]]:
        resp = await asyncio.to_thread(self._api.list_namespaced_pod, NAMESPACE,
                                       _preload_content=False)
        body = json.loads(resp.data)
        return str(body["metadata"]["resourceVersion"]), list(body.get("items") or [])

    def _watch_call(self, **kwargs: Any) -> Any:
        return self._api.list_namespaced_pod(NAMESPACE, **kwargs)

    def _hand(self, item: Listed[list[dict[str, Any]]] | Event) -> None:
        if isinstance(item, Listed):
            for obj in item.value:
                self._deliver(_change("LISTED", obj, time.monotonic()))
        elif item.type in ("ADDED", "MODIFIED", "DELETED") and isinstance(item.object, dict):
            self._deliver(_change(item.type, item.object, item.at))


def _change(kind: str, obj: dict[str, Any], at: float) -> PodChange:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    return PodChange(
        kind=kind, name=str(meta.get("name", "")), uid=str(meta.get("uid", "")),
        phase=str(status.get("phase") or ""), reason=str(status.get("reason") or ""),
        message=str(status.get("message") or ""), at=at,
    )
