"""The HTTP face of the store: routes, request parsing and Status-shaped errors.

Thin on purpose: each handler parses the request, makes one store call and encodes the result.
Everything a test would want to check without a socket lives in `store.py`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from . import patch, resource, selectors
from .errors import ApiError, BadRequest, Expired, NotFound, success_status
from .state import ServerState
from .store import parse_rv
from .watch import error_line

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON = "application/json"


def _same(obj: Any) -> Any:
    return obj


@dataclass(frozen=True)
class View:
    """How one API (core v1 or events.k8s.io/v1) shows a stored resource."""

    resource: str
    list_kind: str
    api_version: str
    to_wire: Callable[[Any], Any] = _same
    from_wire: Callable[[Any], Any] = _same
    field_names: Callable[[str | None], str | None] = field(default=_same)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def reply(obj: Any, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=_dumps)


def error_reply(error: ApiError) -> web.Response:
    return reply(error.status(), error.code)


def _flag(value: str | None) -> bool:
    return value in ("true", "1", "True")


def _int_param(request: web.Request, name: str) -> int | None:
    text = request.query.get(name)
    if text in (None, ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise BadRequest(f"{name}: invalid integer {text!r}") from None


async def _body(request: web.Request, *, optional: bool = False) -> Any:
    raw = await request.read()
    if not raw.strip():
        if optional:
            return None
        raise BadRequest("the request body is empty")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(f"the request body is not valid JSON: {error}") from None


def _object_body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


class Resource:
    """The handlers for one resource as one API shows it."""

    def __init__(self, state: ServerState, view: View) -> None:
        self.state, self.view = state, view
        self.store = state.store

    def _namespace(self, request: web.Request) -> str:
        return request.match_info.get("namespace", "")

    async def collection(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info.get("namespace")
        selector = selectors.parse(
            self.view.resource,
            self.view.field_names(request.query.get("fieldSelector")),
            request.query.get("labelSelector"),
        )
        if _flag(request.query.get("watch")):
            return await self._watch(request, namespace, selector)
        items, rv = self.store.list(self.view.resource, namespace, selector)
        return reply(
            {
                "kind": self.view.list_kind,
                "apiVersion": self.view.api_version,
                "metadata": {"resourceVersion": rv},
                "items": [self.view.to_wire(item) for item in items],
            }
        )

    async def _watch(
        self, request: web.Request, namespace: str | None, selector: selectors.Selector
    ) -> web.StreamResponse:
        since = parse_rv(request.query.get("resourceVersion"))
        timeout = _int_param(request, "timeoutSeconds") or None
        bookmarks = _flag(request.query.get("allowWatchBookmarks"))
        response = web.StreamResponse(headers={"Content-Type": JSON})
        response.enable_chunked_encoding()
        try:
            stream = self.state.hub.open(self.view.resource, namespace, selector, since)
        except Expired as expired:
            # As the real server: the HTTP status is 200 and the 410 is an ERROR event.
            await response.prepare(request)
            await response.write(error_line(expired))
            await response.write_eof()
            return response
        try:
            await response.prepare(request)
            async with asyncio.timeout(timeout):
                await self.state.hub.pump(
                    stream,
                    response.write,
                    convert=self.view.to_wire,
                    bookmark_every=self.state.bookmark_interval if bookmarks else None,
                )
        except TimeoutError:
            pass
        except ConnectionResetError:
            return response
        finally:
            self.state.hub.close(stream)
        await response.write_eof()
        return response

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = self.view.from_wire(_object_body(await _body(request)))
        namespace = self._namespace(request)
        given = (body.get("metadata") or {}).get("namespace")
        if namespace and given and given != namespace:
            raise BadRequest(
                "the namespace of the provided object does not match the namespace "
                "sent on the request"
            )
        created = self.store.create(self.view.resource, namespace, body)
        return reply(self.view.to_wire(created), 201)

    async def get(self, request: web.Request) -> web.StreamResponse:
        namespace, name = self._namespace(request), request.match_info["name"]
        try:
            obj = self.store.get(self.view.resource, namespace, name)
        except NotFound:
            if not (self.view.resource == "nodes" and self.state.auto_create_nodes):
                raise
            obj = self.store.create("nodes", "", {"metadata": {"name": name}})
        return reply(self.view.to_wire(obj))

    async def replace(
        self, request: web.Request, subresource: str | None = None
    ) -> web.StreamResponse:
        body = self.view.from_wire(_object_body(await _body(request)))
        name = request.match_info["name"]
        given = (body.get("metadata") or {}).get("name")
        if given and given != name:
            raise BadRequest(
                f"the name of the object ({given}) does not match the name on the URL ({name})"
            )
        updated = self.store.replace(
            self.view.resource, self._namespace(request), name, body, subresource
        )
        return reply(self.view.to_wire(updated))

    async def patch(
        self, request: web.Request, subresource: str | None = None
    ) -> web.StreamResponse:
        document = await _body(request)
        namespace, name = self._namespace(request), request.match_info["name"]
        content_type = request.headers.get("Content-Type", "")
        resource = self.view.resource
        if self.view.from_wire is _same:
            updated = self.store.patch(
                resource, namespace, name, content_type, document, subresource
            )
        else:
            # A view that renames fields is patched in its own shape, then stored converted.
            shown = self.view.to_wire(self.store.get(resource, namespace, name))
            changed = self.view.from_wire(patch.apply(content_type, shown, document))
            updated = self.store.replace(resource, namespace, name, changed, subresource)
        return reply(self.view.to_wire(updated))

    async def delete(self, request: web.Request) -> web.StreamResponse:
        options = await _body(request, optional=True)
        if options is None:
            # As the real server: the query parameters count only when there is no body.
            options = {"gracePeriodSeconds": _int_param(request, "gracePeriodSeconds")}
        if not isinstance(options, dict):
            raise BadRequest("DeleteOptions must be a JSON object")
        name = request.match_info["name"]
        deleted = self.store.delete(self.view.resource, self._namespace(request), name, options)
        if self.view.resource == "pods" or self.view.api_version == resource.API_VERSION:
            return reply(deleted)  # these return the deleted object, as the real server does
        return reply(success_status(200, {"name": name, "kind": self.view.resource}))

    async def bind(self, request: web.Request) -> web.StreamResponse:
        body = _object_body(await _body(request))
        target = found if isinstance(found := body.get("target"), dict) else {}
        if not target.get("name"):
            raise BadRequest("a binding needs target.name")
        self.store.bind(self._namespace(request), request.match_info["name"], target["name"])
        return reply(success_status(201), 201)
