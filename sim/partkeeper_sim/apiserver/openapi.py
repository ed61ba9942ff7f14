"""OpenAPI v3 for the kinds the simulated API server has, and the strict field check it promises.

What kubectl needs (kubectl 1.27+, `kubectl apply` with the default `--validate=strict`): before
it sends an object it asks whether the server validates fields itself. client-go's
`QueryParamVerifierV3` (k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go) reads
`/openapi/v3` (an index `{"paths": {"api/v1": {"serverRelativeURL": ...}}}`, the same layout as
the real server's), fetches the group-version's document and looks for a PATCH operation whose
`x-kubernetes-group-version-kind` names the object's kind and which takes the `fieldValidation`
query parameter. When it finds one, kubectl sends `?fieldValidation=Strict` and leaves the check
to the server; when it finds none it validates against `/openapi/v2` itself, which this server
does not serve (that was the "failed to download openapi" error).

So each document here lists, per resource, the item path with the GVK extension and
`fieldValidation` on PATCH (and POST/PUT), and component schemas naming the fields of each kind.
`strict_errors` is the server's side of that promise: with `fieldValidation=Strict` an object
naming a field the schema does not is refused with the real server's message
(`Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field
"spec.foo"`, from apimachinery's strict JSON decoding). Pods are described down to their
containers' fields; the other kinds to their top level and metadata (their spec and status are
left open, `x-kubernetes-preserve-unknown-fields`), which is what the sim can vouch for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from . import resource
from .errors import BadRequest, NotFound
from .http import Handler

# Field names of the kinds' objects (k8s.io/api core/v1 types.go, the JSON names).
TOP = ("apiVersion", "kind", "metadata", "spec", "status")
OBJECT_META = (
    "annotations", "creationTimestamp", "deletionGracePeriodSeconds", "deletionTimestamp",
    "finalizers", "generateName", "generation", "labels", "managedFields", "name", "namespace",
    "ownerReferences", "resourceVersion", "selfLink", "uid",
)
POD_SPEC = (
    "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "containers",
    "dnsConfig", "dnsPolicy", "enableServiceLinks", "ephemeralContainers", "hostAliases",
    "hostIPC", "hostNetwork", "hostPID", "hostUsers", "hostname", "imagePullSecrets",
    "initContainers", "nodeName", "nodeSelector", "os", "overhead", "preemptionPolicy",
    "priority", "priorityClassName", "readinessGates", "resourceClaims", "resources",
    "restartPolicy", "runtimeClassName", "schedulerName", "schedulingGates", "securityContext",
    "serviceAccount", "serviceAccountName", "setHostnameAsFQDN", "shareProcessNamespace",
    "subdomain", "terminationGracePeriodSeconds", "tolerations", "topologySpreadConstraints",
    "volumes",
)
CONTAINER = (
    "args", "command", "env", "envFrom", "image", "imagePullPolicy", "lifecycle",
    "livenessProbe", "name", "ports", "readinessProbe", "resizePolicy", "resources",
    "restartPolicy", "securityContext", "startupProbe", "stdin", "stdinOnce",
    "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices",
    "volumeMounts", "workingDir",
)
# Events keep their fields at the top level (no spec).
CORE_EVENT = (
    "action", "apiVersion", "count", "eventTime", "firstTimestamp", "involvedObject", "kind",
    "lastTimestamp", "message", "metadata", "reason", "related", "reportingComponent",
    "reportingInstance", "series", "source", "type",
)
GROUP_EVENT = (
    "action", "apiVersion", "deprecatedCount", "deprecatedFirstTimestamp",
    "deprecatedLastTimestamp", "deprecatedSource", "eventTime", "kind", "metadata", "note",
    "reason", "regarding", "related", "reportingController", "reportingInstance", "series",
    "type",
)


@dataclass(frozen=True, slots=True)
class Kind:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    top: tuple[str, ...] = TOP

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def schema_name(self) -> str:
        group = {"": "core", "events.k8s.io": "events", resource.GROUP: "resource"}[self.group]
        return f"io.k8s.api.{group}.{self.version}.{self.kind}"

    def gvk(self) -> dict[str, str]:
        return {"group": self.group, "version": self.version, "kind": self.kind}


KINDS = (
    Kind("", "v1", "Pod", "pods", True),
    Kind("", "v1", "Node", "nodes", False),
    Kind("", "v1", "Event", "events", True, CORE_EVENT),
    Kind("events.k8s.io", "v1", "Event", "events", True, GROUP_EVENT),
    *(Kind(resource.GROUP, "v1", kind, plural, namespaced)
      for plural, (kind, namespaced, _) in resource.RESOURCES.items()),
)


def _gv_path(kind: Kind) -> str:
    """The index key of a group-version, as client-go's openapi3 root names it."""
    return f"apis/{kind.group}/{kind.version}" if kind.group else f"api/{kind.version}"


def _closed(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def _open(description: str) -> dict[str, Any]:
    return {"type": "object", "description": description,
            "x-kubernetes-preserve-unknown-fields": True}


def _schema(kind: Kind) -> dict[str, Any]:
    meta = {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    props: dict[str, Any] = {name: _open(name) for name in kind.top}
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    props["metadata"] = {"allOf": [meta], "default": {}}
    if kind.kind == "Pod":
        container = _closed({name: _open(name) for name in CONTAINER})
        spec = {name: _open(name) for name in POD_SPEC}
        spec["containers"] = {"type": "array", "items": container}
        spec["initContainers"] = {"type": "array", "items": container}
        props["spec"] = _closed(spec)
    body = _closed(props)
    body["x-kubernetes-group-version-kind"] = [kind.gvk()]
    return body


PARAM_FIELD_VALIDATION = {
    "name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True},
    "description": "fieldValidation instructs the server on how to handle objects in the "
    "request containing unknown or duplicate fields: Ignore, Warn or Strict",
}


def _operation(kind: Kind, action: str, *, validates: bool) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{kind.schema_name}"}
    op: dict[str, Any] = {
        "operationId": f"{action}{kind.kind}",
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": kind.gvk(),
        "parameters": [PARAM_FIELD_VALIDATION] if validates else [],
        "responses": {"200": {"description": "OK",
                              "content": {"application/json": {"schema": ref}}}},
    }
    return op


def _paths(kind: Kind) -> Iterator[tuple[str, dict[str, Any]]]:
    prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
    base = f"{prefix}/namespaces/{{namespace}}/{kind.plural}" if kind.namespaced \
        else f"{prefix}/{kind.plural}"
    yield base, {"get": _operation(kind, "list", validates=False),
                 "post": _operation(kind, "post", validates=True)}
    yield f"{base}/{{name}}", {
        "get": _operation(kind, "get", validates=False),
        "put": _operation(kind, "put", validates=True),
        "patch": _operation(kind, "patch", validates=True),
        "delete": _operation(kind, "delete", validates=False),
    }


def document(gv_path: str) -> dict[str, Any] | None:
    """The OpenAPI v3 document of one group-version (`api/v1`, `apis/<group>/<version>`)."""
    kinds = [k for k in KINDS if _gv_path(k) == gv_path]
    if not kinds:
        return None
    meta = _closed({name: _open(name) for name in OBJECT_META})
    meta["properties"]["name"] = {"type": "string"}
    meta["properties"]["namespace"] = {"type": "string"}
    schemas = {"io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": meta}
    paths: dict[str, Any] = {}
    for kind in kinds:
        schemas[kind.schema_name] = _schema(kind)
        paths.update(_paths(kind))
    return {"openapi": "3.0.0",
            "info": {"title": "Kubernetes (partkeeper simulated API server)", "version": "v1"},
            "paths": paths, "components": {"schemas": schemas}}


def _hash(gv_path: str) -> str:
    body = json.dumps(document(gv_path), sort_keys=True).encode()
    return hashlib.sha512(body).hexdigest()[:128].upper()


def index() -> dict[str, Any]:
    """`/openapi/v3`: each group-version's document by its relative URL (with its hash, as the
    real server names them so clients may cache them)."""
    paths = sorted({_gv_path(k) for k in KINDS})
    return {"paths": {p: {"serverRelativeURL": f"/openapi/v3/{p}?hash={_hash(p)}"}
                      for p in paths}}


# -- the strict check ---------------------------------------------------------------------


def _kind_of(api_version: str, kind_name: str) -> Kind | None:
    for kind in KINDS:
        if kind.api_version == api_version and kind.kind == kind_name:
            return kind
    return None


def _unknown(obj: Any, known: tuple[str, ...], at: str) -> Iterator[str]:
    if isinstance(obj, dict):
        for key in obj:
            if key not in known:
                yield f"{at}{key}"


def strict_errors(body: Any, api_version: str | None = None) -> list[str]:
    """The fields of `body` the served schema does not name, as apimachinery's strict decoder
    lists them (`spec.containers[0].foo`); [] for a kind this server has no schema for."""
    if not isinstance(body, dict):
        return []
    kind = _kind_of(str(body.get("apiVersion") or api_version or ""), str(body.get("kind", "")))
    if kind is None:
        return []
    found = list(_unknown(body, kind.top, ""))
    found += _unknown(body.get("metadata"), OBJECT_META, "metadata.")
    if kind.kind == "Pod" and isinstance(spec := body.get("spec"), dict):
        found += _unknown(spec, POD_SPEC, "spec.")
        for field in ("containers", "initContainers"):
            for i, container in enumerate(spec.get(field) or []):
                found += _unknown(container, CONTAINER, f"spec.{field}[{i}].")
    return found


def strict_message(body: dict[str, Any], errors: list[str]) -> str:
    """The real server's sentence for a strict decoding failure (apimachinery
    `runtime.NewStrictDecodingError`, wrapped by the REST handler's "cannot be handled as")."""
    kind, version = body.get("kind", ""), str(body.get("apiVersion", "")).rsplit("/", 1)[-1]
    fields = ", ".join(f'unknown field "{e}"' for e in errors)
    return (f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding '
            f"error: {fields}")


# -- HTTP -----------------------------------------------------------------------------------


def add_routes(router: web.UrlDispatcher) -> None:
    async def root(_: web.Request) -> web.Response:
        return web.json_response(index())

    async def group_version(request: web.Request) -> web.Response:
        found = document(request.match_info["path"])
        if found is None:
            raise NotFound(f"no OpenAPI v3 document for {request.match_info['path']}")
        return web.json_response(found)

    router.add_get("/openapi/v3", root)
    router.add_get("/openapi/v3/", root)
    router.add_get("/openapi/v3/{path:.+}", group_version)


@web.middleware
async def strict_fields(request: web.Request, handler: Handler) -> web.StreamResponse:
    """`?fieldValidation=Strict` on a create or a replace: refuse unknown fields, as the real
    server does. (aiohttp keeps the body read here for the handler.)"""
    if request.method in ("POST", "PUT") and request.query.get("fieldValidation") == "Strict":
        try:
            body = json.loads(await request.read() or b"null")
        except ValueError:
            body = None  # the handler says what is wrong with it
        if isinstance(body, dict) and (errors := strict_errors(body)):
            raise BadRequest(strict_message(body, errors))
    return await handler(request)
