"""``request_metrics_middleware``: every HTTP request counted by method, route template and status, and timed.

The outermost middleware, so it sees the status the client got, error envelopes included. Routes are labelled
by their template (``/v1/voices/{voice_id}``), never the raw path, and requests for paths no route matches by
``unmatched``, so a scanner's stream of made-up paths adds one series, not one per path; unknown methods are
``other`` for the same reason.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from voxwire.serving.edge.api_errors import CLIENT_CLOSED_STATUS
from voxwire.serving.runtime.keys import METRICS_KEY

UNMATCHED_ROUTE = "unmatched"
"""The ``route`` label of a request no route matches (a 404, or a 405 for a method no route takes)."""
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_SWITCHING_PROTOCOLS = 101
_SERVER_ERROR = 500


def route_template(request: web.Request) -> str:
    """The template of the route that matched ``request`` (``/v1/voices/{voice_id}``), or ``unmatched``."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNMATCHED_ROUTE


@web.middleware
async def request_metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    method = request.method if request.method in _METHODS else "other"
    metrics = request.app[METRICS_KEY]
    try:
        response = await handler(request)
    except (asyncio.CancelledError, ConnectionError):
        # The client left (the error middleware logs it): nothing reached it.
        metrics.observe_http(method, route_template(request), CLIENT_CLOSED_STATUS, time.perf_counter() - started)
        raise
    except Exception:
        # Only a failure after the response began passes the error middleware: the connection is cut mid-body.
        metrics.observe_http(method, route_template(request), _SERVER_ERROR, time.perf_counter() - started)
        raise
    upgraded = response.status == _SWITCHING_PROTOCOLS
    seconds = None if upgraded else time.perf_counter() - started
    metrics.observe_http(method, route_template(request), response.status, seconds)
    return response
