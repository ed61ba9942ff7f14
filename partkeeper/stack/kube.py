"""The demo's Kubernetes side, through the real `kubernetes` client: Pods, binding, a Pod watch.

The client is synchronous: calls run in worker threads (`asyncio.to_thread`), and the watch is
read by a daemon thread that hands each event, stamped with the time it arrived, to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

log = logging.getLogger(__name__)

NAMESPACE = "partkeeper-demo"
WATCH_SECONDS = 5  # each watch request ends this often, so the thread notices it should stop
_GONE = 410


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

    async def delete(self, name: str) -> None:
        """A graceful delete, as `kubectl delete pod` does."""
        await asyncio.to_thread(
            self.api.delete_namespaced_pod, name, NAMESPACE, _preload_content=False
        )


class PodWatch:
    """Pods of the demo namespace as a stream of `PodChange`, delivered on the event loop."""

    def __init__(self, kube: Kube, deliver: Callable[[PodChange], None]) -> None:
        self._api = kube.api
        self._deliver = deliver
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, args=(loop,), name="demo pod watch",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                rv = self._list(loop) if rv is None else self._follow(loop, rv)
            except (ApiException, HTTPError, OSError) as exc:
                rv = None  # 410 Gone or any failure: list afresh
                if isinstance(exc, ApiException) and exc.status == _GONE:
                    continue
                if not self._stop.is_set():
                    log.warning("demo Pod watch failed: %s; listing again", exc)
                    self._stop.wait(0.5)

    def _list(self, loop: asyncio.AbstractEventLoop) -> str:
        resp = self._api.list_namespaced_pod(NAMESPACE, _preload_content=False)
        body = json.loads(resp.data)
        for item in body.get("items") or []:
            self._hand(loop, "LISTED", item)
        return str(body["metadata"]["resourceVersion"])

    def _follow(self, loop: asyncio.AbstractEventLoop, rv: str) -> str:
        stream = watch.Watch().stream(
            self._api.list_namespaced_pod, NAMESPACE, resource_version=rv,
            timeout_seconds=WATCH_SECONDS, allow_watch_bookmarks=True,
        )
        for event in stream:
            if not isinstance(event, dict):
                continue  # a line that is not JSON: the client yields it as None
            obj = event.get("raw_object") or {}
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                self._hand(loop, str(event["type"]), obj)
            if self._stop.is_set():
                break
        return rv

    def _hand(self, loop: asyncio.AbstractEventLoop, kind: str, obj: dict[str, Any]) -> None:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        change = PodChange(
            kind=kind, name=str(meta.get("name", "")), uid=str(meta.get("uid", "")),
            phase=str(status.get("phase") or ""), reason=str(status.get("reason") or ""),
            message=str(status.get("message") or ""), at=time.monotonic(),
        )
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            loop.call_soon_threadsafe(self._deliver, change)
