"""Everything partkeeper says to the Kubernetes API server, in one place.

The `kubernetes` client is blocking, so every call runs in a thread (`asyncio.to_thread`; the
watch in its own thread, see partkeeper/listwatch.py). Answers are kept as plain JSON: the
client's models refuse the malformed objects the watcher must see in order to skip them. Every
request has a timeout, so no thread waits forever on a server that stopped answering.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from datetime import UTC, datetime
from typing import Any, Protocol

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from partkeeper import kubeapi
from partkeeper.config import Config
from services.watcher.observe import Listing, NotFound

COMPONENT = "partkeeper"
MESSAGE_LIMIT = 1024  # what the API server accepts as an Event's note


class PodIdentity(Protocol):
    """What an Event needs of its Pod (a PodRecord, or the names an audit event carries)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...


class KubeError(Exception):
    """The API server could not be reached or refused the request."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Expired(KubeError):
    """410 Gone: the resourceVersion to resume from is older than the server's history."""


class MalformedStream(KubeError):
    """The watch stream carried a line the client could not take apart; nothing was applied."""


def field_selector(node: str) -> str:
    """`spec.nodeName=<node>`, with the selector syntax's special characters escaped."""
    escaped = node.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
    return f"spec.nodeName={escaped}"


def as_kube_error(exc: BaseException, doing: str) -> KubeError:
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        kind = Expired if exc.status == 410 else KubeError
        reason = (exc.reason or "").strip().splitlines()[0] if exc.reason else ""
        return kind(f"{doing}: HTTP {exc.status} {reason}".rstrip(), status=exc.status)
    if isinstance(exc, (KeyError, TypeError, ValueError, AttributeError)):
        # The client's stream parser fails this way on a line that is JSON but not an event.
        return MalformedStream(f"{doing}: a line is not a watch event ({type(exc).__name__}: "
                               f"{exc})")
    return KubeError(f"{doing}: {type(exc).__name__}: {exc}")


class Kube:
    def __init__(
        self, api: client.CoreV1Api, node: str, *, request_timeout: tuple[float, float]
    ) -> None:
        self.api = api
        self.node = node
        self.request_timeout = request_timeout
        # Watch threads using this client: close() must not pull the client from under them.
        self.watch_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()

    @classmethod
    async def connect(
        cls, config: Config, *, request_timeout: tuple[float, float] = (3.0, 15.0)
    ) -> Kube:
        """A client from `config.kubeconfig`, else the in-cluster service account."""
        api_client = await kubeapi.connect(config.kubeconfig, KubeError)
        return cls(client.CoreV1Api(api_client), config.node, request_timeout=request_timeout)

    def close(self, join_timeout: float = 4.0) -> None:
        """Wait (bounded) for stopped watch threads to leave the client, then close it. A daemon
        thread still inside the HTTP client while the interpreter finalises can abort it."""
        deadline = time.monotonic() + join_timeout
        for thread in list(self.watch_threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        self.api.api_client.close()

    async def list_pods(self) -> Listing:
        """The node's Pods, read from the API server's current state (not a cache)."""
        doing = f"LIST of the Pods on node {self.node}"
        try:
            # resourceVersion unset asks for the most recent state: a cached ("0") LIST could be
            # stale and make a live Pod look absent.
            response = await asyncio.to_thread(
                self.api.list_pod_for_all_namespaces,
                field_selector=field_selector(self.node),
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
        except Exception as exc:
            raise as_kube_error(exc, doing) from exc
        body = _json(response.data, doing)
        items = body.get("items") if isinstance(body, dict) else None
        metadata = body.get("metadata") if isinstance(body, dict) else None
        if not isinstance(items, list) or not isinstance(metadata, dict):
            raise KubeError(f"{doing}: the answer is not a PodList")
        if metadata.get("continue"):
            raise KubeError(f"{doing}: the server answered one page of several; not complete")
        return Listing(items=items, resource_version=str(metadata.get("resourceVersion", "")))

    async def get_pod(self, namespace: str, name: str) -> NotFound | Any:
        """The Pod as JSON, or NotFound on a 404."""
        try:
            response = await asyncio.to_thread(
                self.api.read_namespaced_pod, name, namespace,
                _preload_content=False, _request_timeout=self.request_timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return NotFound()
            raise as_kube_error(exc, f"GET of Pod {namespace}/{name}") from exc
        except Exception as exc:
            raise as_kube_error(exc, f"GET of Pod {namespace}/{name}") from exc
        return _json(response.data, f"GET of Pod {namespace}/{name}")

    def watch_call(self, **kwargs: Any) -> urllib3.HTTPResponse:
        """The watch request, for `kubernetes.watch.Watch().stream`.

        A plain function with no declared model type, so the stream hands back the raw JSON
        objects instead of deserialising them.
        """
        return self.api.list_pod_for_all_namespaces(
            field_selector=field_selector(self.node), **kwargs
        )

    async def create_event(
        self, pod: PodIdentity, reason: str, message: str, type: str = "Normal", *,
        name: str | None = None,
    ) -> bool:
        """Record a Kubernetes Event on the Pod (e.g. a partition blocked or reclaimed).

        The Event names the Pod by UID too, so it can be recorded for a Pod already deleted.
        With `name` the Event is created under that name and one already there (409
        AlreadyExists) is the same Event recorded before: returns False then, True when
        created. Without it the server generates a name. Raises KubeError.
        """
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        metadata = {"name": name} if name else {"generateName": f"{pod.name}."}
        body = {
            "metadata": {**metadata, "namespace": pod.namespace},
            "involvedObject": {
                "kind": "Pod", "apiVersion": "v1", "namespace": pod.namespace,
                "name": pod.name, "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:MESSAGE_LIMIT],
            "type": type,
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await asyncio.to_thread(
                self.api.create_namespaced_event, pod.namespace, body,
                _preload_content=False, _request_timeout=self.request_timeout,
            )
        except ApiException as exc:
            if name and exc.status == 409:
                return False
            raise as_kube_error(exc, f"creating Event {reason} on Pod {pod.uid}") from exc
        except Exception as exc:
            raise as_kube_error(exc, f"creating Event {reason} on Pod {pod.uid}") from exc
        return True


def _json(data: bytes, doing: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise KubeError(f"{doing}: the answer is not JSON ({exc})") from exc


