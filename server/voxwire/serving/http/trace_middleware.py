"""HTTP side of tracing: ``trace_middleware`` makes each request's span, ``utterance_trace`` a speech request's spans.

Both read the app's ``TRACING_KEY`` (``tracing_from_environment``; None when traces are off, and then the middleware
only passes the request on). The request span is named ``METHOD route`` (the route's template, e.g.
``DELETE /v1/voices/{voice_id}``, so names stay few) and carries the OpenTelemetry HTTP attributes, never the query
string (a browser's API key travels there), and ``voxwire.request_id`` (the response's ``X-Request-Id``).
"""

from __future__ import annotations

import asyncio

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from voxwire.serving.edge.request_id import request_id
from voxwire.serving.http.request_metrics import UNMATCHED_ROUTE, route_template
from voxwire.serving.runtime.keys import CONFIG_KEY, TRACING_KEY
from voxwire.serving.runtime.tracing import UNTRACED, Tracing, UtteranceTrace


def add_tracing(app: web.Application, tracing: Tracing | None) -> None:
    """Trace the app's requests with ``tracing`` (None: not at all); its exporters are flushed when the app closes,
    for at most ``trace_flush_timeout_s``."""
    app[TRACING_KEY] = tracing
    app.on_cleanup.append(_flush)


async def _flush(app: web.Application) -> None:
    tracing = app[TRACING_KEY]
    if tracing is not None:  # off the loop: a frontend's loop keeps its heartbeat while it waits
        await asyncio.to_thread(tracing.shutdown, app[CONFIG_KEY].limits.trace_flush_timeout_s)


@web.middleware
async def trace_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request's ``SERVER`` span, around the error envelope (its status is the one the client gets)."""
    tracing = request.app.get(TRACING_KEY)
    if tracing is None:
        return await handler(request)
    route = route_template(request)
    matched = route != UNMATCHED_ROUTE
    attributes = {
        "http.request.method": request.method,
        "url.path": request.path,
        "url.scheme": request.scheme,
        "user_agent.original": request.headers.get(hdrs.USER_AGENT, ""),
        "voxwire.request_id": request_id(request),
    }
    if matched:
        attributes["http.route"] = route
    name = f"{request.method} {route}" if matched else request.method
    with tracing.server_span(name, request.headers, attributes) as span:
        response = await handler(request)
        span.set_status_code(response.status)
        return response


def utterance_trace(request: web.Request) -> UtteranceTrace:
    """The spans of the utterance a request speaks (``UNTRACED``, which makes none, when traces are off)."""
    tracing = request.app.get(TRACING_KEY)
    return UNTRACED if tracing is None else tracing.utterance()
