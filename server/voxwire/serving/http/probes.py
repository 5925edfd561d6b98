"""``/health``, ``/ready`` and ``/metrics``: what load balancers, orchestrators and Prometheus ask."""

from __future__ import annotations

from aiohttp import hdrs, web

from voxwire.serving.edge.admission import readiness, require_accepting
from voxwire.serving.edge.error_envelope import ApiError, not_ready_answer
from voxwire.serving.edge.request_id import request_id
from voxwire.serving.runtime.keys import (
    METRICS_KEY,
)


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    # Public: nothing about the deployment (the model's source may be a local path).
    try:
        require_accepting(request.app)
    except ApiError as refused:
        return not_ready_answer(refused, readiness(request.app), request_id(request))
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[METRICS_KEY]
    return web.Response(body=registry.exposition(), headers={hdrs.CONTENT_TYPE: registry.content_type})


def add_probe_routes(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
