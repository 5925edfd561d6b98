"""LoRA personas over HTTP: ``POST /v1/loras`` (load a folder inside ``--lora-root``), list, delete (the persona's
owner only: ``serving.speech.persona_names``)."""

from __future__ import annotations

from aiohttp import web

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.admission import require_accepting
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.http.body import read_json
from voxwire.serving.http.request_models import LORA
from voxwire.serving.runtime.keys import CONFIG_KEY, OWNER_KEY, SPEAKER_KEY
from voxwire.serving.speech.persona_names import Personas


async def create_lora(request: web.Request) -> web.Response:
    """``POST /v1/loras`` ``{"name", "path"}``: load a LoRA checkpoint folder inside ``--lora-root`` as a persona
    owned by the request's API key."""
    app = request.app
    require_accepting(app)  # loading shares the model with the engine: not during warm-up or shutdown
    body = await read_json(request, app[CONFIG_KEY].limits.body_timeout_s)
    fields = LORA.parse(body, app[CONFIG_KEY])
    info = await persona_registry(app).add(fields["name"], fields["path"], owner=request.get(OWNER_KEY))
    return web.json_response(info.to_json(), status=201)


async def list_loras(request: web.Request) -> web.Response:
    infos = await persona_registry(request.app).infos()
    return web.json_response({"object": "list", "data": [info.to_json() for info in infos]})


async def delete_lora(request: web.Request) -> web.Response:
    """Requests already speaking with the persona finish with it; new ones get ``unknown_persona``. Only the key
    that added it may (403 ``forbidden`` otherwise, and always for an operator's ``--lora`` persona)."""
    name = request.match_info["name"]
    await persona_registry(request.app).remove(name, owner=request.get(OWNER_KEY))
    return web.json_response({"name": name, "object": "lora", "deleted": True})


def persona_registry(app: web.Application) -> Personas:
    """The server's personas; 400 ``personas_unavailable`` where there are none (``--model sim``)."""
    personas = app[SPEAKER_KEY].personas
    if personas is None:
        message = "this server cannot serve LoRA personas (they need a checkpoint model)"
        raise ApiError(ErrorCode.PERSONAS_UNAVAILABLE, message)
    return personas


def add_lora_routes(app: web.Application) -> None:
    app.router.add_post("/v1/loras", create_lora)
    app.router.add_get("/v1/loras", list_loras)
    app.router.add_delete("/v1/loras/{name}", delete_lora)
