"""The simulated scheduler: allocates the ResourceClaims of pending Pods and binds them.

Each pass reads the Pods, ResourceClaims, DeviceClasses and ResourceSlices afresh and then, as
the real control plane does:

- claims of Pods that are done lose their reservation; a claim reserved for nobody is deleted
  when a Pod owned it (made from a template) and deallocated otherwise;
- a template entry of a pending Pod gets its claim, named in `status.resourceClaimStatuses`;
- pending unbound Pods, oldest first, get every claim allocated (`allocate.allocate`: complete
  pools, counters subtracted for every allocated claim, first fit) or none; the allocation and
  the reservation are written, then the Pod is bound. A Pod that does not fit stays Pending with
  a PodScheduled=False condition saying why, and is tried again on the next pass;
- a pending Pod asking for extended resources (KEP-5004, extended.py): those a DeviceClass maps
  and the Node does not advertise get the special ResourceClaim, allocated with the Pod's other
  claims, created, reserved, and named with its request mappings in the Pod's
  `status.extendedResourceClaimStatus` before the binding; those the Node's device plugins
  advertise are checked against its allocatable (NodeResourcesFit) and left to the kubelet.

Passes run every `interval` seconds and on `wake()`; the real scheduler's informers are replaced
by fresh lists, which the simulated API server answers in microseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from partkeeper.lifecycle import woken_or_timeout
from partkeeper_sim.scheduler import allocate, cel, claims, extended

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
# The in-memory name of a Pod's special claim until the API server names it (generateName).
SPECIAL = "\x00extended-resources"


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
        mapping = extended.class_mapping(classes)
        allocatable = self._allocatable()
        pending = [p for p in pods if (claims.entries(p) or extended.pod_extended(p))
                   and not p["spec"].get("nodeName")
                   and (p.get("status") or {}).get("phase", "Pending") == "Pending"
                   and not p["metadata"].get("deletionTimestamp")]
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""),
                                    p["metadata"].get("namespace", ""), p["metadata"]["name"]))
        bound = [p for p in pods if p["spec"].get("nodeName") == self.node
                 and not claims.pod_done(by_uid, p["metadata"]["uid"])]
        for pod in pending:
            try:
                served = extended.through_dra(pod, mapping, allocatable)
            except extended.DoesNotFit as exc:
                self._unschedulable(pod, str(exc))
                continue
            made = extended.made_for(pod, found)
            if made is not None and allocate.results_of(made):
                # Made and allocated by a pass that failed before the binding: the Pod is bound
                # with it, never given a second one (upstream's PreFilter finds the Pod's
                # special claim again by its annotation and owner, and reuses it).
                self._name_special(pod, made)
                served = {}
            elif short := extended.device_plugin_shortage(pod, served, allocatable, bound):
                self._unschedulable(pod, short)
                continue
            if self._schedule(pod, found, classes, inventory, served, mapping):
                bound.append(pod)

    def _allocatable(self) -> dict[str, str]:
        """What the Node advertises (its kubelet's device plugins among it); {} without one."""
        try:
            node = json.loads(self.core.read_node(self.node, _preload_content=False).data)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return dict((node.get("status") or {}).get("allocatable") or {})

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
                  classes: dict[str, Any], inventory: allocate.Inventory,
                  served: dict[str, int], mapping: dict[str, str]) -> bool:
        meta = pod["metadata"]
        namespace = meta.get("namespace", "default")
        mine = self._claims_of(pod, found)
        if mine is None:
            return False
        special = None
        if served:
            special = extended.special_claim(pod, served, mapping)
            special["metadata"]["name"] = SPECIAL
        unallocated = [c for c in mine if not allocate.results_of(c)]
        allocated = [c for c in found if allocate.results_of(c)]
        try:
            results = allocate.allocate(inventory, classes, allocated,
                                        [*unallocated, *([special] if special else [])])
        except (allocate.Unsatisfiable, cel.SelectorError) as exc:
            self._unschedulable(pod, str(exc))
            return False
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
            # A later Pod of this pass sharing the claim adds itself to this list, not to the
            # one read before the pass (the merge patch replaces the whole list).
            claim.setdefault("status", {})["reservedFor"] = status["reservedFor"]
        if special is not None:
            self._bind_special(pod, special, results[SPECIAL], ref, found)
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
                 ", ".join(c["metadata"]["name"] for c in mine) or "(none)")
        return True

    def _bind_special(self, pod: dict[str, Any], special: dict[str, Any],
                      results: list[dict[str, str]], ref: dict[str, str],
                      found: list[dict[str, Any]]) -> None:
        """PreBind for the special claim (dynamicresources.go, `bindClaim`): create it, write
        its allocation and reservation, then name it in the Pod's status with its mappings."""
        meta = pod["metadata"]
        namespace = meta.get("namespace", "default")
        del special["metadata"]["name"]
        made = self.resource.create_namespaced_resource_claim(namespace, special,
                                                              _preload_content=False)
        name = json.loads(made.data)["metadata"]["name"]
        status = {"allocation": {"devices": {"results": results}}, "reservedFor": [ref]}
        self.resource.patch_namespaced_resource_claim_status(
            name, namespace, {"status": status}, _content_type=MERGE_PATCH)
        found.append({**special, "metadata": {**special["metadata"], "name": name,
                                              "namespace": namespace}, "status": status})
        mappings = self._name_special(pod, {**special, "metadata": {"name": name}})
        log.info("made ResourceClaim %s/%s for the extended resources of Pod %s: %s", namespace,
                 name, meta["name"], ", ".join(f"{m['containerName']}:{m['resourceName']}="
                                              f"{m['requestName']}" for m in mappings))

    def _name_special(self, pod: dict[str, Any], claim: Mapping[str, Any]
                      ) -> list[dict[str, str]]:
        """Write the special claim and its request mappings into the Pod's status."""
        meta = pod["metadata"]
        mappings = extended.request_mappings(claim, pod)
        status = extended.claim_status(claim["metadata"]["name"], mappings)
        self.core.patch_namespaced_pod_status(
            meta["name"], meta.get("namespace", "default"),
            {"status": {"extendedResourceClaimStatus": status}}, _content_type=MERGE_PATCH)
        return mappings

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
