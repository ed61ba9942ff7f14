"""A watch asking for its initial events (`sendInitialEvents`, the WatchList feature) is refused,
as a kube-apiserver 1.30 with the feature gate off refuses it (this server says it is 1.30).

client-go 1.35+ (kubectl 1.35+, whose `WatchListClient` gate is on by default) opens its
reflectors' watches with `sendInitialEvents=true&resourceVersionMatch=NotOlderThan` and waits
for a BOOKMARK marked `k8s.io/initial-events-end`; a server that does not stream initial events
must refuse the request, and the reflector then "falls back to the standard LIST/WATCH
semantics" (client-go tools/cache/reflector.go). This server does not stream them, so it
refuses with the real validation errors (apimachinery's
`internalversion/validation.validateWatchOptions`, a 422 Invalid on `ListOptions`). Without
this, `kubectl delete --wait` from kubectl 1.35+ waited forever for that bookmark.
"""

from __future__ import annotations

from aiohttp import web

from .errors import Invalid
from .http import Handler

GATE = "unless the WatchList feature gate is enabled"


def refusal(query: dict[str, str]) -> str | None:
    """The validation message for a watch's list options, or None when they are allowed."""
    if query.get("watch") not in ("true", "1", "True"):
        return None
    errors = []
    if query.get("resourceVersionMatch"):
        errors.append(f"resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for "
                      f"watch {GATE}")
    if "sendInitialEvents" in query:
        errors.append(f"sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch "
                      f"{GATE}")
    if not errors:
        return None
    return f'ListOptions.meta.k8s.io "" is invalid: [{", ".join(errors)}]'


@web.middleware
async def no_initial_events(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method == "GET" and (why := refusal(dict(request.query))) is not None:
        raise Invalid(why)
    return await handler(request)
