"""Who uses this node's ResourceClaims, for `partkeeper_partition_info` (DRA mode).

A DRA partition belongs to a ResourceClaim, which may serve several Pods and containers. The
ResourceClaim watch (claimwatch.py) hands every claim it sees to `seen`; the claims allocated in
this node's pool keep their reserving Pods here (`status.reservedFor`, so a Pod added to or
removed from a shared claim shows at once). Which containers of a Pod use the claim is in the
Pod's spec and status, which do not change once it runs: each reserving Pod is read once
(`run`, with backoff while the API server fails) and remembered while it reserves the claim.
The readings are partkeeper/telemetry/claimusers.py.

What is not known yet (the Pod not read, or gone) shows as the Pod with an empty `container`;
nothing here decides anything but labels, and every change wakes the recompute that sets them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from partkeeper import backoff
from partkeeper.dra import DRIVER
from partkeeper.listwatch import Listed
from partkeeper.telemetry.claimusers import PodRef, Reservation, containers_using, reservation
from partkeeper.telemetry.partitions import User
from services.allocator.dra.kube import Item, KubeError, ResourceApi


def in_pool(claim: Any, node: str) -> bool:
    """Whether the claim's allocation names a device of our driver in this node's pool."""
    allocation = (claim.get("status") or {}).get("allocation") or {} if isinstance(
        claim, dict) else {}
    results = (allocation.get("devices") or {}).get("results") or []
    return any(isinstance(r, dict) and r.get("driver") == DRIVER and r.get("pool") == node
               for r in results)


class ClaimUsers:
    def __init__(self, api: ResourceApi, node: str, changed: Callable[[], None]) -> None:
        self.api = api
        self.node = node
        self.changed = changed  # wakes the recompute, which reads `users()` afresh
        self._claims: dict[str, Reservation] = {}  # ResourceClaim UID -> its reserving Pods
        self._containers: dict[tuple[str, str], tuple[str, ...]] = {}  # (Pod UID, claim name)
        self._wanted = asyncio.Event()

    def seen(self, item: Item) -> None:
        """A LIST or a watch event of the ResourceClaims."""
        before = dict(self._claims)
        if isinstance(item, Listed):
            self._claims = {}
            for body in item.value:
                self._take(body)
        elif item.type in ("ADDED", "MODIFIED"):
            self._take(item.object, drop=True)
        elif item.type == "DELETED":
            found = reservation(item.object)
            if found is not None:
                self._claims.pop(found.uid, None)
        if self._claims == before:
            return
        reserved = {(p.uid, r.name) for r in self._claims.values() for p in r.pods}
        self._containers = {k: v for k, v in self._containers.items() if k in reserved}
        if self._unread():
            self._wanted.set()
        self.changed()

    def _take(self, body: Any, *, drop: bool = False) -> None:
        found = reservation(body)
        if found is None:
            return
        if in_pool(body, self.node):
            self._claims[found.uid] = found
        elif drop:
            self._claims.pop(found.uid, None)

    def _unread(self) -> list[tuple[PodRef, Reservation]]:
        return [(p, r) for r in self._claims.values() for p in r.pods
                if (p.uid, r.name) not in self._containers]

    def users(self) -> dict[str, list[User]]:
        """ResourceClaim UID -> one User per (Pod, container) using it."""
        out: dict[str, list[User]] = {}
        for uid, r in self._claims.items():
            users = out.setdefault(uid, [])
            for pod in r.pods:
                names = self._containers.get((pod.uid, r.name)) or ("",)
                users.extend(User(r.namespace, pod.name, name) for name in names)
        return out

    async def run(self) -> None:
        await backoff.every("reading the containers of the Pods using ResourceClaims", None,
                            self._read, wakeup=self._wanted,
                            transient=lambda exc: isinstance(exc, KubeError))

    async def _read(self) -> None:
        for pod, claim in self._unread():
            try:
                body = await self.api.get_pod(claim.namespace, pod.name)
            except KubeError as exc:
                if exc.status != 404:
                    raise
                body = None  # gone: the claim's next event drops it from reservedFor
            same = isinstance(body, dict) and (body.get("metadata") or {}).get("uid") == pod.uid
            self._containers[(pod.uid, claim.name)] = (
                containers_using(body, claim.name) if same else ())
            self.changed()
