"""`PodSource` on the Kubernetes API (the `kubernetes` client): list+watch, status, final delete.

The client is synchronous, so each request runs in a worker thread; the list and watch are
`partkeeper.listwatch.ListWatch`, the one the watcher and the demo use. Pods are decoded from the
raw JSON (`pod_from_manifest`), the same parser the in-memory source uses.

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
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from partkeeper.listwatch import EndedAtOnce, Event, Expired, Listed, ListWatch, WatchFailed
from partkeeper_sim.kubelet import podstatus
from partkeeper_sim.kubelet.pods import PodEvent, PodSpecError, PodView, pod_from_manifest
from partkeeper_sim.kubelet.resourcehealth import Statuses

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
# (connect, read) of every request but the watch, which `ListWatch` bounds itself. Without it a
# cancelled call's worker thread can block for ever on a server that stopped answering, and
# interpreter exit waits for that thread.
REQUEST_TIMEOUT = (10.0, 30.0)


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
        self._retry_delay = retry_delay
        self._known: dict[str, PodView] = {}
        self._started: dict[str, str] = {}  # uid -> the startTime first written
        # uid -> the phase, reason and message last written, and the devices' health: a health
        # change writes the whole status again (a merge patch replaces containerStatuses).
        self._last: dict[str, tuple[str, str, str]] = {}
        self._health: dict[str, Statuses] = {}
        self._writing: dict[str, asyncio.Lock] = {}  # uid -> one status write at a time
        self._listwatch: ListWatch[list[PodView]] = ListWatch(
            self._list, self._watch_call, timeout_seconds=watch_timeout_seconds,
            request_timeout=(10.0, 30.0),
        )

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
        while True:
            try:
                async with contextlib.aclosing(self._listwatch.items()) as items:
                    async for item in items:
                        for event in self._events(item):
                            yield event
            except Expired:
                log.info("watch of Pods on %s expired; listing again", self._node)
            except EndedAtOnce as exc:
                log.warning("%s; watching again", exc)
                await asyncio.sleep(self._retry_delay)
            except (WatchFailed, ApiException, HTTPError, OSError) as exc:
                log.warning("Pod list/watch on %s failed (%r); retrying", self._node, exc)
                self._listwatch.resume_from = None
                await asyncio.sleep(self._retry_delay)

    def _selector(self) -> str:
        return f"spec.nodeName={self._node}"

    async def _list(self) -> tuple[str, list[PodView]]:
        resp = await asyncio.to_thread(
            self._api.list_pod_for_all_namespaces,
            field_selector=self._selector(), _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        body = json.loads(resp.data)
        views = [v for v in (_decode(item) for item in body.get("items") or []) if v]
        return str(body.get("metadata", {}).get("resourceVersion", "")), views

    def _watch_call(self, **kwargs: Any) -> Any:
        return self._api.list_pod_for_all_namespaces(field_selector=self._selector(), **kwargs)

    def _events(self, item: Listed[list[PodView]] | Event) -> list[PodEvent]:
        if isinstance(item, Listed):
            return relist_events(self._known, item.value)
        if item.type not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(item.object, dict):
            return []  # BOOKMARK, or a line that is not JSON: only the resourceVersion matters
        view = _decode(item.object)
        if view is None or (view.node and view.node != self._node):
            return []
        if item.type == "DELETED":
            self._known.pop(view.uid, None)
            for kept in (self._started, self._last, self._health, self._writing):
                kept.pop(view.uid, None)
            return [PodEvent("deleted", view)]
        self._known[view.uid] = view
        return [PodEvent("upsert", view)]

    # -- writing ---------------------------------------------------------------------------

    async def set_phase(self, uid: str, phase: str, reason: str, message: str) -> None:
        async with self._writing.setdefault(uid, asyncio.Lock()):
            await self._write_status(uid, phase, reason, message)

    async def set_resource_health(self, uid: str, health: Statuses) -> None:
        """The containers' allocatedResourcesStatus: written with the last phase at once, or
        with the first phase write when none was made yet."""
        async with self._writing.setdefault(uid, asyncio.Lock()):
            self._health[uid] = health
            last = self._last.get(uid)
            if last is not None:
                await self._write_status(uid, *last)

    async def _write_status(self, uid: str, phase: str, reason: str, message: str) -> None:
        pod = self._known.get(uid)
        if pod is None:
            log.info("not reporting %s for Pod %s: it is no longer on %s", phase, uid, self._node)
            return
        # null removes a field in a merge patch, so a Running report clears an old reason.
        fields = podstatus.status_fields(pod, phase, reason, self._started.get(uid),
                                         allocated=self._health.get(uid))
        body = {
            "metadata": {"uid": uid},
            "status": {**fields, "phase": phase, "reason": reason or None,
                       "message": message or None},
        }
        self._started.setdefault(uid, body["status"]["startTime"])
        self._last[uid] = (phase, reason, message)
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
            await asyncio.to_thread(call, *args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as exc:
            # 404: already gone; 409: the name now belongs to another Pod (UID precondition).
            if exc.status not in (404, 409):
                raise
            log.info("%s on %s/%s: %s (ignored)", call.__name__, args[1], args[0], exc.status)
