"""The URL map of the simulated API server and the middleware that turns failures into Status.

Paths follow the real API: core resources under /api/v1, Events also under
/apis/events.k8s.io/v1, namespaced collections under /namespaces/{namespace}/.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from . import discovery, events, openapi, resource, table, watchlist
from .errors import ApiError, InternalError, MethodNotAllowed, NotFound, ServiceUnavailable
from .http import Handler, Resource, View, error_reply, reply
from .state import ServerState

log = logging.getLogger(__name__)

PODS = View("pods", "PodList", "v1")
NODES = View("nodes", "NodeList", "v1")
CORE_EVENTS = View("events", "EventList", "v1")
GROUP_EVENTS = View(
    "events",
    "EventList",
    events.EVENTS_API,
    to_wire=events.from_core,
    from_wire=events.to_core,
    field_names=events.core_field_selector,
)


def build_app(state: ServerState) -> web.Application:
    # Inside the error middleware: kubectl's Tables, the strict field check and the refusal of
    # WatchList requests (table.py, openapi.py, watchlist.py) wrap the resource handlers
    # without their knowing.
    app = web.Application(middlewares=[_middleware(state), watchlist.no_initial_events,
                                       table.tables, openapi.strict_fields])
    router = app.router
    openapi.add_routes(router)
    for path in ("/healthz", "/readyz", "/livez"):
        router.add_get(path, _ok)
    _add_discovery(router, state)
    pods = Resource(state, PODS)
    _add_resource(router, "/api/v1", "pods", pods, namespaced=True, status=True)
    router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/binding", pods.bind)
    nodes = Resource(state, NODES)
    _add_resource(router, "/api/v1", "nodes", nodes, namespaced=False, status=True)
    _add_resource(router, "/api/v1", "events", Resource(state, CORE_EVENTS), namespaced=True)
    group_events = Resource(state, GROUP_EVENTS)
    _add_resource(router, "/apis/events.k8s.io/v1", "events", group_events, namespaced=True)
    for plural, (kind, namespaced, status) in resource.RESOURCES.items():
        view = View(plural, f"{kind}List", resource.API_VERSION)
        _add_resource(router, resource.PREFIX, plural, Resource(state, view),
                      namespaced=namespaced, status=status)
    return app


def _add_resource(
    router: web.UrlDispatcher,
    prefix: str,
    plural: str,
    resource: Resource,
    *,
    namespaced: bool,
    status: bool = False,
) -> None:
    router.add_get(f"{prefix}/{plural}", resource.collection)
    base = f"{prefix}/namespaces/{{namespace}}/{plural}" if namespaced else f"{prefix}/{plural}"
    if namespaced:
        router.add_get(base, resource.collection)
    router.add_post(base, resource.create)
    item = f"{base}/{{name}}"
    router.add_get(item, resource.get)
    router.add_put(item, resource.replace)
    router.add_patch(item, resource.patch)
    router.add_delete(item, resource.delete)
    if status:
        router.add_get(f"{item}/status", resource.get)
        router.add_put(f"{item}/status", functools.partial(resource.replace, subresource="status"))
        router.add_patch(f"{item}/status", functools.partial(resource.patch, subresource="status"))


def _add_discovery(router: web.UrlDispatcher, state: ServerState) -> None:
    async def version(_: web.Request) -> web.Response:
        return reply(discovery.version(state.kubernetes_version))

    async def api(request: web.Request) -> web.Response:
        return reply(discovery.api_versions(request.host))

    # The client asks for some of these with a trailing slash ("/version/", "/api/").
    for path, handler in (
        ("/version", version),
        ("/api", api),
        ("/api/v1", _document(discovery.core_resources)),
        ("/apis", _document(discovery.api_groups)),
        ("/apis/events.k8s.io", _document(discovery.events_group)),
        ("/apis/events.k8s.io/v1", _document(discovery.events_resources)),
        (f"/apis/{resource.GROUP}", _document(discovery.resource_group)),
        (resource.PREFIX, _document(discovery.resource_resources)),
    ):
        router.add_get(path, handler)
        router.add_get(f"{path}/", handler)


def _document(make: Callable[[], dict[str, Any]]) -> Handler:
    """A handler answering with a discovery document that depends on nothing in the request."""

    async def handler(_: web.Request) -> web.Response:
        return reply(make())

    return handler


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def _middleware(state: ServerState) -> Middleware:
    @web.middleware
    async def handle(request: web.Request, handler: Handler) -> web.StreamResponse:
        if state.unavailable:
            return error_reply(ServiceUnavailable("the simulated API server is unavailable"))
        try:
            return await handler(request)
        except ApiError as error:
            return error_reply(error)
        except web.HTTPNotFound:
            return error_reply(NotFound("the server could not find the requested resource"))
        except web.HTTPMethodNotAllowed:
            return error_reply(MethodNotAllowed(f"{request.method} is not supported here"))
        except (web.HTTPException, asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as error:
            # A bug here must reach the client as a 500 it can see, not as a dropped connection.
            log.exception("simulated API server failed on %s %s", request.method, request.path)
            return error_reply(InternalError(f"internal error: {error!r}"))

    return handle
