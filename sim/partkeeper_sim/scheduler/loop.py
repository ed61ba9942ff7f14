"""The simulated scheduler: allocates the ResourceClaims of pending Pods and binds them.

Each pass reads the Pods, ResourceClaims, DeviceClasses and ResourceSlices afresh and then, as
the real control plane does:

- claims of Pods that are done lose their reservation; a claim reserved for nobody is deleted
  when a Pod owned it (made from a template) and deallocated otherwise;
- a template entry of a pending Pod gets its claim, named in `status.resourceClaimStatuses`;
- pending unbound Pods, oldest first, get every claim allocated (`allocate.allocate`: complete
  pools, counters subtracted for every allocated claim, first fit) or none; the allocation and
  the reservation are written, then the Pod is bound. A Pod that does not fit stays Pending with
  a PodScheduled=False condition saying why, and is tried again on the next pass.

Passes run every `interval` seconds and on `wake()`; the real scheduler's informers are replaced
by fresh lists, which the simulated API server answers in microseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from partkeeper.lifecycle import woken_or_timeout
from partkeeper_sim.scheduler import allocate, cel, claims

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"


def _items(listing: Any) -> list[dict[str, Any]]:
    return list(listing.get("items") or [])


class DraScheduler:
    def __init__(self, api_client: client.ApiClient, node: str, *, interval: float = 0.05
                 ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.node = node
        self.interval = interval
        self.passes = 0
        self.bound: list[str] = []  # Pod UIDs, in binding order
        self._reasons: dict[str, str] = {}
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()  # before the pass: a wake() during it runs the next one
            try:
                await asyncio.to_thread(self.once)
            except (ApiException, OSError, ValueError) as exc:
                log.warning("scheduler pass failed (%s); again next pass", exc)
            await woken_or_timeout(self._wake, self.interval)

    def _list(self, method: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return _items(json.loads(method(_preload_content=False, **kwargs).data))

    def once(self) -> None:
        self.passes += 1
        pods = self._list(self.core.list_pod_for_all_namespaces)
        found = self._list(self.resource.list_resource_claim_for_all_namespaces)
        by_uid = {p["metadata"]["uid"]: p for p in pods}
        for claim in found:
            self._settle(claim, by_uid)
        found = self._list(self.resource.list_resource_claim_for_all_namespaces)
        classes = {c["metadata"]["name"]: c for c in self._list(self.resource.list_device_class)}
        inventory = allocate.complete_pools(self._list(self.resource.list_resource_slice))
        pending = [p for p in pods if claims.entries(p) and not p["spec"].get("nodeName")
                   and (p.get("status") or {}).get("phase", "Pending") == "Pending"
                   and not p["metadata"].get("deletionTimestamp")]
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""),
                                    p["metadata"].get("namespace", ""), p["metadata"]["name"]))
        for pod in pending:
            self._schedule(pod, found, classes, inventory)

    def _settle(self, claim: dict[str, Any], pods: dict[str, dict[str, Any]]) -> None:
        step = claims.after_done(claim, pods)
        if step is None:
            return
        what, refs = step
        name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
        if what == "delete":
            with contextlib.suppress(ApiException):
                self.resource.delete_namespaced_resource_claim(name, namespace)
            log.info("deleted ResourceClaim %s/%s: its Pod is done", namespace, name)
            return
        status = {"reservedFor": refs} if what == "reserve" else {
            "allocation": None, "reservedFor": None}
        self.resource.patch_namespaced_resource_claim_status(
            name, namespace, {"status": status}, _content_type=MERGE_PATCH)

    def _schedule(self, pod: dict[str, Any], found: list[dict[str, Any]],
                  classes: dict[str, Any], inventory: allocate.Inventory) -> None:
        meta = pod["metadata"]
        namespace = meta.get("namespace", "default")
        mine = self._claims_of(pod, found)
        if mine is None:
            return
        unallocated = [c for c in mine if not allocate.results_of(c)]
        allocated = [c for c in found if allocate.results_of(c)]
        try:
            results = allocate.allocate(inventory, classes, allocated, unallocated)
        except (allocate.Unsatisfiable, cel.SelectorError) as exc:
            self._unschedulable(pod, str(exc))
            return
        ref = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
        for claim in mine:
            status: dict[str, Any] = {"reservedFor": [
                *((claim.get("status") or {}).get("reservedFor") or []), ref]}
            name = claim["metadata"]["name"]
            if name in results:
                status["allocation"] = {"devices": {"results": results[name]}}
                claim.setdefault("status", {})["allocation"] = status["allocation"]
            self.resource.patch_namespaced_resource_claim_status(
                name, namespace, {"status": status}, _content_type=MERGE_PATCH)
        if self._reasons.pop(meta["uid"], None) is not None:
            # The binding adds PodScheduled=True; the False one written earlier goes first.
            self.core.patch_namespaced_pod_status(
                meta["name"], namespace, {"status": {"conditions": None}},
                _content_type=MERGE_PATCH)
        self.core.create_namespaced_pod_binding(
            meta["name"], namespace, {"apiVersion": "v1", "kind": "Binding",
                        "metadata": {"name": meta["name"], "namespace": namespace},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}},
            _preload_content=False)
        self.bound.append(meta["uid"])
        log.info("bound Pod %s/%s to %s with claims %s", namespace, meta["name"], self.node,
                 ", ".join(c["metadata"]["name"] for c in mine))

    def _claims_of(self, pod: dict[str, Any], found: list[dict[str, Any]]
                   ) -> list[dict[str, Any]] | None:
        """The Pod's claims, made from templates where needed; None while one is missing."""
        meta = pod["metadata"]
        namespace = meta.get("namespace", "default")
        by_name = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in found}
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        mine = []
        for entry in claims.entries(pod):
            name = claims.claim_name(pod, entry)
            if name is None and entry.get("resourceClaimTemplateName"):
                template = self.resource.read_namespaced_resource_claim_template(
                    entry["resourceClaimTemplateName"], namespace, _preload_content=False)
                body = claims.from_template(pod, entry, json.loads(template.data))
                self.resource.create_namespaced_resource_claim(namespace, body)
                name = body["metadata"]["name"]
                statuses.append({"name": entry["name"], "resourceClaimName": name})
                self.core.patch_namespaced_pod_status(
                    meta["name"], namespace, {"status": {"resourceClaimStatuses": statuses}},
                    _content_type=MERGE_PATCH)
                return None  # the next pass sees the claim and the Pod's status together
            claim = by_name.get((namespace, name or ""))
            if claim is None:
                self._unschedulable(pod, f"ResourceClaim {namespace}/{name} does not exist")
                return None
            mine.append(claim)
        return mine

    def _unschedulable(self, pod: dict[str, Any], why: str) -> None:
        meta = pod["metadata"]
        if self._reasons.get(meta["uid"]) == why:
            return
        self._reasons[meta["uid"]] = why
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": f"0/1 nodes are available: {why}"}
        with contextlib.suppress(ApiException):
            self.core.patch_namespaced_pod_status(
                meta["name"], meta.get("namespace", "default"),
                {"status": {"conditions": [condition]}}, _content_type=MERGE_PATCH)
