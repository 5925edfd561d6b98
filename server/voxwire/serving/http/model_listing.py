"""OpenAI's model listing: ``GET /v1/models`` and ``GET /v1/models/{model}``, for clients that discover the model.

The one served model is listed under its public name (``ModelInfo.name``: a hub id, or a local folder's own name),
the name the voice listings show. ``POST /v1/audio/speech`` takes any ``model`` (OpenAI's ``tts-1`` included), so
the listing tells a model picker what runs here rather than what may be asked for. ``created`` is when this server
started; ``owned_by`` is ``voxwire``.
"""

from __future__ import annotations

import time

from aiohttp import web

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.runtime.keys import SPEAKER_KEY

OWNED_BY = "voxwire"


def add_model_routes(app: web.Application) -> None:
    started = int(time.time())

    def model_object(app: web.Application) -> dict[str, object]:
        return {"id": app[SPEAKER_KEY].info.name, "object": "model", "created": started, "owned_by": OWNED_BY}

    async def list_models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [model_object(request.app)]})

    async def retrieve_model(request: web.Request) -> web.Response:
        model = model_object(request.app)
        if request.match_info["model"] != model["id"]:
            raise ApiError(ErrorCode.NOT_FOUND, f"this server serves model {model['id']!r} only (see GET /v1/models)")
        return web.json_response(model)

    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)  # hub ids have a slash: openbmb/VoxCPM2
