"""`PodSource` on the Kubernetes API (the `kubernetes` client): list+watch, status, final delete.

The client is synchronous, so each request runs in a worker thread and the watch stream is read
by a daemon thread that hands lines to the event loop. Pods are decoded from the raw JSON
(`pod_from_manifest`), the same parser the in-memory source uses.

Semantics follow kubelet's: Pods are listed with `fieldSelector=spec.nodeName=<node>`, oldest
first; the watch resumes from the last resourceVersion and a 410 Gone relists, reporting as
deleted any Pod the new list lacks. Status is a JSON merge patch of phase, reason and message
carrying `metadata.uid` as precondition; the final delete has grace 0 and a UID precondition,
so a successor with the same name is never deleted by mistake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError

from partkeeper.sim.kubelet.pods import PodEvent, PodSpecError, PodView, pod_from_manifest

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
_GONE = 410


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def relist_events(known: dict[str, PodView], listed: Iterable[PodView]) -> list[PodEvent]:
    """Events that bring `known` to the `listed` state; updates `known` in place.

    Upserts oldest first by (creationTimestamp, namespace, name), as kubelet admits them; Pods
    that vanished between watches are reported deleted.
    """
    fresh = {p.uid: p for p in listed}
    order = sorted(fresh.values(), key=lambda p: (p.created, p.namespace, p.name))
    events = [PodEvent("deleted", known[uid]) for uid in sorted(set(known) - set(fresh))]
    events += [PodEvent("upsert", p) for p in order]
    known.clear()
    known.update(fresh)
    return events


def _decode(raw: dict[str, Any]) -> PodView | None:
    try:
        return pod_from_manifest(raw)
    except PodSpecError as exc:
        log.warning("skipping a Pod the kubelet cannot read: %s", exc)
        return None


class ClusterPodSource:
    """Pods bound to `node`, read from and written to the API server behind `api`."""

    def __init__(
        self,
        api: client.CoreV1Api,
        node: str,
        *,
        watch_timeout_seconds: int = 240,
        retry_delay: float = 1.0,
    ) -> None:
        self._api = api
        self._node = node
        self._watch_timeout = watch_timeout_seconds
        self._retry_delay = retry_delay
        self._known: dict[str, PodView] = {}

    @classmethod
    def from_kubeconfig(cls, node: str, kubeconfig: str | Path | None = None) -> ClusterPodSource:
        """Client from `kubeconfig`, else in-cluster config, else the default kubeconfig."""
        if kubeconfig:
            return cls(client.CoreV1Api(config.new_client_from_config(str(kubeconfig))), node)
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
        return cls(client.CoreV1Api(client.ApiClient(cfg)), node)

    # -- reading ---------------------------------------------------------------------------

    async def pods(self) -> AsyncIterator[PodEvent]:
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    listed_at, listed = await asyncio.to_thread(self._list)
                    rv = listed_at
                    for event in relist_events(self._known, listed):
                        yield event
                async for change, seen in self._watch(rv):
                    rv = seen
                    if change is not None:
                        yield change
            except WatchExpired:
                log.info("watch of Pods on %s expired; listing again", self._node)
                rv = None
            except (ApiException, HTTPError, OSError) as exc:
                log.warning("Pod list/watch on %s failed (%r); retrying", self._node, exc)
                rv = None
                await asyncio.sleep(self._retry_delay)

    def _selector(self) -> str:
        return f"spec.nodeName={self._node}"

    def _list(self) -> tuple[str, list[PodView]]:
        resp = self._api.list_pod_for_all_namespaces(
            field_selector=self._selector(), _preload_content=False
        )
        body = json.loads(resp.data)
        views = [v for v in (_decode(item) for item in body.get("items") or []) if v]
        return str(body.get("metadata", {}).get("resourceVersion", "")), views

    def _open_watch(self, rv: str) -> Any:
        return self._api.list_pod_for_all_namespaces(
            field_selector=self._selector(),
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            watch=True,
            _preload_content=False,
            _request_timeout=(10, self._watch_timeout + 30),
        )

    async def _watch(self, rv: str) -> AsyncIterator[tuple[PodEvent | None, str]]:
        """(event or None, resourceVersion) per watch line, until the server ends the watch."""
        resp = await asyncio.to_thread(self._open_watch, rv)
        loop = asyncio.get_running_loop()
        lines: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        threading.Thread(
            target=_pump, args=(resp, loop, lines), name="sim-kubelet watch", daemon=True
        ).start()
        try:
            while True:
                kind, item = await lines.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                event, rv = self._on_line(item, rv)
                yield event, rv
        finally:
            _close(resp)

    def _on_line(self, line: str, rv: str) -> tuple[PodEvent | None, str]:
        if not line.strip():
            return None, rv
        message = json.loads(line)
        kind, obj = message.get("type"), message.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == _GONE:
                raise WatchExpired(obj.get("message", ""))
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return None, rv  # BOOKMARK: only the resourceVersion matters
        view = _decode(obj)
        if view is None or (view.node and view.node != self._node):
            return None, rv
        if kind == "DELETED":
            self._known.pop(view.uid, None)
            return PodEvent("deleted", view), rv
        self._known[view.uid] = view
        return PodEvent("upsert", view), rv

    # -- writing ---------------------------------------------------------------------------

    async def set_phase(self, uid: str, phase: str, reason: str, message: str) -> None:
        pod = self._known.get(uid)
        if pod is None:
            log.info("not reporting %s for Pod %s: it is no longer on %s", phase, uid, self._node)
            return
        # null removes a field in a merge patch, so a Running report clears an old reason.
        body = {
            "metadata": {"uid": uid},
            "status": {"phase": phase, "reason": reason or None, "message": message or None},
        }
        await self._tolerating_gone(
            self._api.patch_namespaced_pod_status,
            pod.name,
            pod.namespace,
            body,
            _content_type=MERGE_PATCH,
        )

    async def finalize_delete(self, namespace: str, name: str, uid: str) -> None:
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
        )
        await self._tolerating_gone(self._api.delete_namespaced_pod, name, namespace, body=options)

    async def _tolerating_gone(self, call: Any, *args: Any, **kwargs: Any) -> None:
        try:
            await asyncio.to_thread(call, *args, **kwargs)
        except ApiException as exc:
            # 404: already gone; 409: the name now belongs to another Pod (UID precondition).
            if exc.status not in (404, 409):
                raise
            log.info("%s on %s/%s: %s (ignored)", call.__name__, args[1], args[0], exc.status)


def _pump(
    resp: Any, loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[tuple[str, Any]]
) -> None:
    """Thread body: hand each watch line to the loop, then "end" or the error."""

    def put(kind: str, item: Any) -> None:
        # RuntimeError: the loop is closed, nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(lines.put_nowait, (kind, item))

    try:
        for line in iter_resp_lines(resp):
            put("line", line)
    except Exception as exc:  # any read failure ends this watch; pods() decides what next
        put("error", exc)
    else:
        put("end", None)


def _close(resp: Any) -> None:
    """Unblock the reading thread and release the connection."""
    shutdown = getattr(resp, "shutdown", None)  # urllib3>=2.3 interrupts a blocked read
    try:
        if shutdown is not None:
            shutdown()
        resp.close()
        resp.release_conn()
    except Exception as exc:  # closing twice or a half-dead socket; nothing left to do
        log.debug("closing the Pod watch: %r", exc)
