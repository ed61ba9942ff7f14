"""The allocator's resource.k8s.io/v1 calls in DRA mode: read ResourceClaims, keep the node's
ResourceSlices. (In device-plugin mode the allocator never speaks to the API server; a DRA
driver must, since the slices and the claims live there.)

The client is blocking, so every call runs in a thread with a timeout; answers stay plain JSON.
Every failure is a `KubeError` naming the call and what the server said.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from partkeeper import kubeapi
from partkeeper.config import Config
from partkeeper.dra import DRIVER
from partkeeper.listwatch import Event, Listed

TIMEOUT = (3.0, 15.0)

# What the allocator's list-watches (slices, claims) hand their readers: plain JSON objects.
Item = Listed[list[dict[str, Any]]] | Event


class KubeError(Exception):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ResourceApi:
    def __init__(self, api: client.ResourceV1Api, node: str) -> None:
        self.api = api
        self.core = client.CoreV1Api(api.api_client)
        self.node = node

    @classmethod
    async def connect(cls, config: Config) -> ResourceApi:
        api_client = await kubeapi.connect(config.kubeconfig, KubeError)
        return cls(client.ResourceV1Api(api_client), config.node)

    def close(self) -> None:
        self.api.api_client.close()

    async def _call(self, doing: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            response = await asyncio.to_thread(
                method, *args, _preload_content=False, _request_timeout=TIMEOUT, **kwargs
            )
        except ApiException as exc:
            reason = (exc.reason or "").strip()
            raise KubeError(f"{doing}: HTTP {exc.status} {reason}".rstrip(),
                            status=exc.status) from exc
        except Exception as exc:
            raise KubeError(f"{doing}: {type(exc).__name__}: {exc}") from exc
        try:
            return json.loads(response.data)
        except ValueError as exc:
            raise KubeError(f"{doing}: the answer is not JSON ({exc})") from exc

    async def get_claim(self, namespace: str, name: str) -> Any:
        return await self._call(f"GET of ResourceClaim {namespace}/{name}",
                                self.api.read_namespaced_resource_claim, name, namespace)

    async def get_pod(self, namespace: str, name: str) -> Any:
        """A Pod using a ResourceClaim, for the containers that use it (users.py)."""
        return await self._call(f"GET of Pod {namespace}/{name}",
                                self.core.read_namespaced_pod, name, namespace)

    async def list_claims_at(self) -> tuple[str, list[dict[str, Any]]]:
        """The list's resourceVersion and every ResourceClaim (all namespaces: a claim has no
        field naming its node to select on; only metadata.name and metadata.namespace are)."""
        body = await self._call("LIST of the ResourceClaims",
                                self.api.list_resource_claim_for_all_namespaces)
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list) or (body.get("metadata") or {}).get("continue"):
            raise KubeError("LIST of the ResourceClaims: not a complete list")
        return str((body.get("metadata") or {}).get("resourceVersion", "")), items

    def watch_claims(self, **kwargs: Any) -> Any:
        """The blocking watch call `partkeeper.listwatch` runs in its thread."""
        return self.api.list_resource_claim_for_all_namespaces(**kwargs)

    async def server_version(self) -> Any:
        """The API server's /version document."""
        return await self._call("GET of /version", client.VersionApi(self.api.api_client).get_code)

    async def node_owner(self) -> dict[str, Any]:
        """The owner reference every slice of this node carries: the Node, as controller (the
        upstream resourceslice controller's `Owner`), so a deleted Node's slices are
        garbage-collected."""
        body = await self._call(f"GET of Node {self.node}", self.core.read_node, self.node)
        uid = (body.get("metadata") or {}).get("uid") if isinstance(body, dict) else None
        if not uid:
            raise KubeError(f"GET of Node {self.node}: the answer carries no UID")
        return {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid,
                "controller": True}

    @property
    def slice_selector(self) -> str:
        escaped = self.node.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
        return f"spec.nodeName={escaped},spec.driver={DRIVER}"

    async def list_slices(self) -> list[dict[str, Any]]:
        """This node's slices of our driver; raises KubeError (never an empty list on failure)."""
        return (await self.list_slices_at())[1]

    async def list_slices_at(self) -> tuple[str, list[dict[str, Any]]]:
        """The list's resourceVersion and this node's slices of our driver."""
        body = await self._call(
            f"LIST of the ResourceSlices of node {self.node}", self.api.list_resource_slice,
            field_selector=self.slice_selector,
        )
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list) or (body.get("metadata") or {}).get("continue"):
            raise KubeError(f"LIST of the ResourceSlices of node {self.node}: not a complete list")
        return str((body.get("metadata") or {}).get("resourceVersion", "")), items

    def watch_slices(self, **kwargs: Any) -> Any:
        """The blocking watch call `partkeeper.listwatch` runs in its thread."""
        return self.api.list_resource_slice(field_selector=self.slice_selector, **kwargs)

    async def create_slice(self, body: dict[str, Any]) -> Any:
        name = body["metadata"]["name"]
        return await self._call(f"creating ResourceSlice {name}",
                                self.api.create_resource_slice, body)

    async def replace_slice(self, body: dict[str, Any]) -> Any:
        name = body["metadata"]["name"]
        return await self._call(f"updating ResourceSlice {name}",
                                self.api.replace_resource_slice, name, body)

    async def delete_slice(self, name: str) -> None:
        try:
            await self._call(f"deleting ResourceSlice {name}", self.api.delete_resource_slice,
                             name)
        except KubeError as exc:
            if exc.status != 404:
                raise
