"""``GET /openapi.json`` (the HTTP API in OpenAPI 3.1) and ``GET /docs`` (a page that shows it, shipped with the
package: ``docs.html``, no CDN).

Every operation is in ``OPERATIONS``; its request body is the ``request_models`` model its handler validates
with, so the document states what the handler checks, with this server's limits (a document is made per
server from its configuration). A route the application registers is documented only if it is in the table,
and ``tests/serving/test_openapi.py`` fails for a route the table lacks.
"""

from __future__ import annotations

import enum
import mimetypes
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from voxwire import __version__
from voxwire.audio.elevenlabs_formats import DEFAULT_OUTPUT_FORMAT, parse_output_format, supported_formats
from voxwire.audio.formats import OPENAI_RESPONSE_FORMATS, make_encoder
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import STREAM_PATH
from voxwire.serving.edge.auth import DEMO_FILE_SUFFIXES, DEMO_FILES_PREFIX, DEMO_PAGE, DOCS_PATH, OPENAPI_PATH
from voxwire.serving.http import elevenlabs_request
from voxwire.serving.http.connections import static_file
from voxwire.serving.http.elevenlabs_request import STREAMING_LATENCY_LEVELS, TEXT_TO_SPEECH
from voxwire.serving.http.elevenlabs_tts import (
    NDJSON,
    STREAM_WITH_TIMESTAMPS_PATH,
    TEXT_TO_SPEECH_PATH,
    TEXT_TO_SPEECH_STREAM_PATH,
    WITH_TIMESTAMPS_PATH,
)
from voxwire.serving.http.request_models import (
    ENCODE_LATENTS,
    GENERATE,
    LORA,
    MODELS,
    NANO_LORA,
    OPENAI_VOICE_CREATE,
    SPEECH,
    VOICE_UPLOAD,
    RequestModel,
)
from voxwire.serving.runtime.keys import CONFIG_KEY, SPEAKER_KEY
from voxwire.serving.ws.elevenlabs_protocol import MULTI_STREAM_INPUT_PATH, STREAM_INPUT_PATH

DOCS_PAGE = Path(__file__).resolve().with_name("docs.html")
"""The ``/docs`` page: HTML and a small script that renders ``/openapi.json`` (package data)."""

_JSON = "application/json"


class ErrorShape(enum.Enum):
    """The error bodies of an API: voxwire's envelope, or Nano-vLLM's FastAPI ``detail``."""

    VOXWIRE = "voxwire"
    NANOVLLM = "nanovllm"


Content = Mapping[str, Any] | Callable[[web.Application], Mapping[str, Any]]
"""A response's media types, each with its body's schema (an empty one: any bytes), or what makes them from the
application."""


@dataclass(frozen=True)
class Operation:
    """One route: what it takes, what it answers."""

    method: str
    path: str
    tag: str
    summary: str
    ok: Mapping[int, Content]
    """Success statuses and their content."""
    errors: tuple[int, ...] = ()
    """Error statuses its handler may answer (401 and 403 are added where keys and origins apply)."""
    body: RequestModel | None = None
    description: str = ""
    public: bool = False
    """Open without an API key (the probes, the demo files, this document)."""
    shape: ErrorShape = ErrorShape.VOXWIRE
    parameters: tuple[dict[str, Any], ...] = field(default=())


def _path_parameter(name: str, description: str, *, segments: bool = False) -> dict[str, Any]:
    # aiohttp's {name} matches one non-empty path segment; {name:.+} (``segments``) one or more
    schema = {"type": "string", "minLength": 1, **({} if segments else {"pattern": "^[^/]+$"})}
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


def _query_parameter(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


_ELEVENLABS_PARAMETERS = (
    _path_parameter("voice_id", "A saved voice's id, or an OpenAI voice name for the model's default voice."),
    _query_parameter(
        "output_format",
        {"type": "string", "default": DEFAULT_OUTPUT_FORMAT},
        "ElevenLabs' output format: pcm_<rate>, ulaw_8000, alaw_8000, mp3_<rate>_<kbps> or opus_48000_<kbps> "
        "(400 unsupported_format for one this server does not make).",
    ),
    _query_parameter("seed", {"type": "integer"}, "Noise seed, for reproducible audio."),
    _query_parameter(
        "sync_alignment",
        {"type": "string", "enum": ["true", "false"], "default": "false"},
        "true: alignment times count from the start of the context's audio, else from each sentence's.",
    ),
)


_ELEVENLABS_HTTP_PARAMETERS = (
    _path_parameter("voice_id", "A saved voice's id, a built-in voice's name, or an alias of one (--voice-alias)."),
    _query_parameter(
        "output_format",
        {"type": "string", "enum": supported_formats(), "default": DEFAULT_OUTPUT_FORMAT},
        "ElevenLabs' output format (opus_48000_<kbps>: Ogg Opus).",
    ),
    _query_parameter(
        "optimize_streaming_latency",
        {"type": "string", "enum": list(STREAMING_LATENCY_LEVELS)},
        "Accepted and ignored: the audio streams as soon as it is generated.",
    ),
    _query_parameter("enable_logging", {"type": "string", "enum": ["true", "false"]}, "Accepted and ignored."),
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(required: Mapping[str, Any], optional: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}


_STRING: dict[str, Any] = {"type": "string"}
_INTEGER: dict[str, Any] = {"type": "integer"}
_NUMBER: dict[str, Any] = {"type": "number"}
_BOOLEAN: dict[str, Any] = {"type": "boolean"}
_BYTES: dict[str, Any] = {}
"""A body of bytes (audio, a file): no JSON schema applies."""


def _list_of(item: dict[str, Any]) -> dict[str, Any]:
    return _object({"object": {"const": "list"}, "data": {"type": "array", "items": item}})


def _deleted(key: str, kind: str, **more: dict[str, Any]) -> dict[str, Any]:
    return _object({key: _STRING, "object": {"const": kind}, "deleted": {"const": True}, **more})


_NAME_ONLY = _object({"name": _STRING})
_ELEVENLABS_VOICE = _object(
    {
        "voice_id": _STRING,
        "name": _STRING,
        "category": {"enum": ["premade", "cloned"]},
        "description": {"type": ["string", "null"]},
        "labels": {"type": "object"},
        "preview_url": {"type": "null"},
        "created_at_unix": {"type": ["integer", "null"]},
    }
)
_ELEVENLABS_VOICES = {"type": "array", "items": _ELEVENLABS_VOICE}
_CHARACTER_TIMES = {
    "anyOf": [
        _object(
            {
                "characters": {"type": "array", "items": _STRING},
                "character_start_times_seconds": {"type": "array", "items": _NUMBER},
                "character_end_times_seconds": {"type": "array", "items": _NUMBER},
            }
        ),
        {"type": "null"},
    ]
}
_AUDIO_WITH_TIMESTAMPS = _object(
    {"audio_base64": _STRING, "alignment": _CHARACTER_TIMES, "normalized_alignment": _CHARACTER_TIMES}
)
_AUDIO_VOICE = _object(
    {"id": _STRING, "name": _STRING, "builtin": _BOOLEAN, "description": {"type": ["string", "null"]}}
)
_OPENAI_VOICE = _object(
    {
        "id": _STRING,
        "object": {"const": "audio.voice"},
        "name": _STRING,
        "created_at": _INTEGER,
        "type": {"const": "audio_sample"},
    }
)
_REQUEST_ID = {"type": "string", "description": "The response's X-Request-Id."}
_LATENTS = _object(
    {
        "prompt_latents_base64": _STRING,
        "feat_dim": _INTEGER,
        "latents_dtype": {"const": "float32"},
        "sample_rate": _INTEGER,
        "channels": _INTEGER,
    }
)

SCHEMAS: dict[str, dict[str, Any]] = {
    "Error": _object(
        {
            "error": _object(
                {
                    "code": {
                        "type": "string",
                        "enum": [code.value for code in ErrorCode if code.http_status is not None],
                    },
                    "message": _STRING,
                    "request_id": _REQUEST_ID,
                }
            )
        }
    ),
    "NanoError": _object(
        {
            "request_id": _REQUEST_ID,
            "detail": {
                "oneOf": [
                    _STRING,
                    {
                        "type": "array",
                        "items": _object(
                            {
                                "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
                                "msg": _STRING,
                                "type": _STRING,
                            }
                        ),
                    },
                ]
            },
        }
    ),
    "SpeechEvent": {
        **_object({"data": _STRING}, {"event": _STRING}),
        "description": "One server-sent event (stream_format sse): its data is JSON, "
        '{"type": "speech.audio.delta", "audio": <base64>} for each block of audio, then '
        '{"type": "speech.audio.done", "usage": {"input_tokens", "output_tokens", "total_tokens"}}.',
    },
    "Voice": _object(
        {
            "object": {"const": "voice"},
            "id": _STRING,
            "name": _STRING,
            "transcript": {"type": ["string", "null"]},
            "model": _STRING,
            "duration_s": _NUMBER,
            "created_at": _INTEGER,
        },
        {"builtin": _BOOLEAN, "description": {"type": ["string", "null"]}},  # in the listings
    ),
    "Model": _object({"id": _STRING, "object": {"const": "model"}, "created": _INTEGER, "owned_by": _STRING}),
    "Lora": _object(
        {
            "name": _STRING,
            "object": {"const": "lora"},
            "path": _STRING,
            "rank": _INTEGER,
            "alpha": _NUMBER,
            "targets": _object({"lm": _BOOLEAN, "dit": _BOOLEAN, "projections": _BOOLEAN}),
            "in_use": _INTEGER,
        }
    ),
    "Info": _object(
        {
            "model": _object(
                {
                    "sample_rate": _INTEGER,
                    "channels": _INTEGER,
                    "feat_dim": _INTEGER,
                    "patch_size": _INTEGER,
                    "model_path": _STRING,
                }
            ),
            "lora": _object(
                {
                    "enabled": _BOOLEAN,
                    "max_loras": _INTEGER,
                    "max_lora_rank": _INTEGER,
                    "registered_names": {"type": "array", "items": _STRING},
                    "loaded": _BOOLEAN,
                }
            ),
            "mp3": _object({"bitrate_kbps": _INTEGER, "quality": _INTEGER}),
        }
    ),
}
"""The response bodies' schemas (the request bodies' come from ``request_models``)."""


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {_JSON: schema}


def _speech_media(app: web.Application) -> dict[str, Any]:
    """The media types of ``/v1/audio/speech``: each format's encoder's, and SSE."""
    sample_rate = app[SPEAKER_KEY].info.sample_rate
    types = {
        make_encoder(fmt, sample_rate, output_rate=rate).content_type.partition(";")[0].strip()
        for fmt, rate in OPENAI_RESPONSE_FORMATS.values()
    }
    return {**{media: _BYTES for media in sorted(types)}, "text/event-stream": _ref("SpeechEvent")}


def _elevenlabs_media(app: web.Application) -> dict[str, Any]:
    """The media types of ElevenLabs' audio routes: each output format's encoder's."""
    sample_rate = app[SPEAKER_KEY].info.sample_rate
    types = {
        parse_output_format(name).encoder(sample_rate).content_type.partition(";")[0] for name in supported_formats()
    }
    return {media: _BYTES for media in sorted(types)}


def _demo_media(app: web.Application) -> dict[str, Any]:
    """The media types of the demo page's files, by their suffixes."""
    types = {mimetypes.guess_type("file" + suffix)[0] for suffix in DEMO_FILE_SUFFIXES}
    return {media: _BYTES for media in sorted(media for media in types if media is not None)}


_ELEVENLABS_SPEECH: tuple[tuple[str, str, Mapping[int, Content]], ...] = (
    (TEXT_TO_SPEECH_PATH, "Speak text; the audio streams while it is generated", {200: _elevenlabs_media}),
    (TEXT_TO_SPEECH_STREAM_PATH, "Speak text; the audio streams while it is generated", {200: _elevenlabs_media}),
    (
        WITH_TIMESTAMPS_PATH,
        "Speak text: the audio (base64) and its characters' times",
        {200: _json(_AUDIO_WITH_TIMESTAMPS)},
    ),
    (
        STREAM_WITH_TIMESTAMPS_PATH,
        "Speak text: JSON lines of audio (base64) and its characters' times",
        {200: {NDJSON: _AUDIO_WITH_TIMESTAMPS}},
    ),
)
"""ElevenLabs' text-to-speech routes: (path, summary, success content)."""

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "POST",
        "/v1/audio/speech",
        "OpenAI",
        "Speak text; the audio streams while it is generated",
        {200: _speech_media},
        (400, 404, 408, 413, 422, 503),
        SPEECH,
        description="OpenAI's speech endpoint. 503 (not_ready, shutting_down, busy) has Retry-After.",
    ),
    Operation(
        "GET",
        "/v1/voices",
        "Voices",
        "List the voices (ours in data, ElevenLabs' shape in voices)",
        {
            200: _json(
                _object(
                    {
                        "object": {"const": "list"},
                        "data": {"type": "array", "items": _ref("Voice")},
                        "voices": _ELEVENLABS_VOICES,
                    }
                )
            )
        },
    ),
    Operation(
        "GET",
        "/v1/voices/{voice_id}",
        "ElevenLabs",
        "One voice, in ElevenLabs' shape",
        {200: _json(_ELEVENLABS_VOICE)},
        (404,),
        parameters=(_path_parameter("voice_id", "A voice's id or built-in name, or an alias of one."),),
    ),
    Operation(
        "GET",
        "/v2/voices",
        "ElevenLabs",
        "A page of the voices, in ElevenLabs' shape",
        {
            200: _json(
                _object(
                    {
                        "voices": _ELEVENLABS_VOICES,
                        "has_more": _BOOLEAN,
                        "total_count": _INTEGER,
                        "next_page_token": {"type": ["string", "null"]},
                    }
                )
            )
        },
        (400,),
        parameters=(
            _query_parameter(
                "page_size", {"type": "integer", "minimum": 1, "maximum": 100, "default": 10}, "Voices per page."
            ),
            _query_parameter(
                "next_page_token", {"type": "string", "pattern": "^[0-9]{1,9}$"}, "The previous page's next_page_token."
            ),
            _query_parameter("search", _STRING, "Only voices whose names contain it (ignoring case)."),
        ),
    ),
    *(
        Operation(
            "POST",
            path,
            "ElevenLabs",
            summary,
            ok,
            (400, 404, 408, 413, 503),
            TEXT_TO_SPEECH,
            description="ElevenLabs' text-to-speech; its clients work with only the URL changed (docs/http-api.md). "
            "Character times are estimates. 503 (not_ready, shutting_down, busy) has Retry-After.",
            parameters=_ELEVENLABS_HTTP_PARAMETERS,
        )
        for path, summary, ok in _ELEVENLABS_SPEECH
    ),
    Operation(
        "GET",
        "/v1/audio/voices",
        "Voices",
        "Every voice a request may name, for voice pickers",
        {200: _json(_object({"voices": {"type": "array", "items": _AUDIO_VOICE}}))},
    ),
    Operation(
        "POST",
        "/v1/audio/voices",
        "OpenAI",
        "Save a voice from a clip, as the OpenAI SDK's audio.voices.create (encoded once)",
        {201: _json(_OPENAI_VOICE)},
        (400, 408, 409, 413, 503),
        OPENAI_VOICE_CREATE,
    ),
    Operation(
        "DELETE",
        "/v1/audio/voices/{voice_id}",
        "OpenAI",
        "Delete a saved voice (its owner only), as the OpenAI SDK's audio.voices.delete",
        {200: _json(_deleted("id", "audio.voice.deleted"))},
        (403, 404),
        parameters=(_path_parameter("voice_id", "The voice's id."),),
    ),
    Operation("GET", "/v1/models", "OpenAI", "The model this server serves", {200: _json(_list_of(_ref("Model")))}),
    Operation(
        "GET",
        "/v1/models/{model}",
        "OpenAI",
        "The model, by its id (404 for another)",
        {200: _json(_ref("Model"))},
        (404,),
        parameters=(_path_parameter("model", "The model's id (a hub id has a slash).", segments=True),),
    ),
    Operation(
        "POST",
        "/v1/voices",
        "Voices",
        "Save a voice from a clip (encoded once)",
        {201: _json(_ref("Voice"))},
        (400, 408, 409, 413, 503),
        VOICE_UPLOAD,
    ),
    Operation(
        "DELETE",
        "/v1/voices/{voice_id}",
        "Voices",
        "Delete a saved voice (its owner only)",
        {200: _json(_deleted("id", "voice", status={"const": "ok"}))},  # status: ElevenLabs' SDK reads it
        (403, 404),
        parameters=(_path_parameter("voice_id", "The voice's id."),),
    ),
    Operation(
        "GET", "/v1/loras", "Personas", "List the LoRA personas", {200: _json(_list_of(_ref("Lora")))}, (400, 503)
    ),
    Operation(
        "POST",
        "/v1/loras",
        "Personas",
        "Load a LoRA persona from a folder inside --lora-root",
        {201: _json(_ref("Lora"))},
        (400, 404, 408, 409, 413, 503),
        LORA,
    ),
    Operation(
        "DELETE",
        "/v1/loras/{name}",
        "Personas",
        "Remove a LoRA persona (its owner only)",
        {200: _json(_deleted("name", "lora"))},
        (400, 403, 404, 503),
        parameters=(_path_parameter("name", "The persona's name."),),
    ),
    Operation(
        "GET",
        STREAM_PATH,
        "WebSocket",
        "The streaming WebSocket (an upgrade; see docs/protocol.md)",
        {101: {}},
        (400, 503),
        description="A GET without the WebSocket upgrade is a 400. 503 (not ready, draining, full) has Retry-After.",
    ),
    *(
        Operation(
            "GET",
            path,
            "WebSocket",
            f"ElevenLabs' {path.rsplit('/', 1)[1]} WebSocket (an upgrade)",
            {101: {}},
            (400, 404, 503),
            description="ElevenLabs' clients work with only the URL changed (docs/clients.md). A GET without the "
            "WebSocket upgrade is a 400; an unknown voice a 404 before the upgrade.",
            parameters=_ELEVENLABS_PARAMETERS,
        )
        for path in (STREAM_INPUT_PATH, MULTI_STREAM_INPUT_PATH)
    ),
    Operation(
        "POST",
        "/generate",
        "Nano-vLLM-VoxCPM",
        "Speak text (Nano-vLLM-VoxCPM's API)",
        {200: {"audio/mpeg": _BYTES, "audio/L16": _BYTES}},
        (400, 408, 413, 422, 503),
        GENERATE,
        description="mp3, or pcm (audio/L16;rate=<rate>;channels=1) with X-Audio-Sample-Rate, X-Audio-Channels and "
        "X-Audio-Encoding.",
        shape=ErrorShape.NANOVLLM,
    ),
    Operation(
        "POST",
        "/encode_latents",
        "Nano-vLLM-VoxCPM",
        "Encode a clip as prompt latents",
        {200: _json(_LATENTS)},
        (400, 408, 413, 422, 503),
        ENCODE_LATENTS,
        shape=ErrorShape.NANOVLLM,
    ),
    Operation(
        "GET",
        "/info",
        "Nano-vLLM-VoxCPM",
        "The model, LoRA and mp3 settings",
        {200: _json(_ref("Info"))},
        (503,),
        shape=ErrorShape.NANOVLLM,
    ),
    Operation(
        "GET",
        "/loras",
        "Nano-vLLM-VoxCPM",
        "The registered LoRA names",
        {200: _json({"type": "array", "items": _NAME_ONLY})},
        shape=ErrorShape.NANOVLLM,
    ),
    Operation(
        "POST",
        "/loras",
        "Nano-vLLM-VoxCPM",
        "Register a LoRA",
        {200: _json(_NAME_ONLY)},
        (400, 403, 408, 409, 413, 422, 503),
        NANO_LORA,
        shape=ErrorShape.NANOVLLM,
    ),
    Operation(
        "DELETE",
        "/loras/{name}",
        "Nano-vLLM-VoxCPM",
        "Unregister a LoRA",
        {200: _json(_NAME_ONLY)},
        (400, 403, 404, 503),
        shape=ErrorShape.NANOVLLM,
        parameters=(_path_parameter("name", "The LoRA's name."),),
    ),
    Operation("GET", "/health", "Probes", "Liveness", {200: _json(_object({"status": {"const": "ok"}}))}, public=True),
    Operation(
        "GET",
        "/ready",
        "Probes",
        "Readiness: 503 while starting (its phase beside the error) or draining",
        {200: _json(_object({"status": {"const": "ready"}}))},
        (503,),
        public=True,
    ),
    Operation("GET", "/metrics", "Probes", "Prometheus metrics", {200: {"text/plain": _BYTES}}),
    Operation("GET", DEMO_PAGE, "Pages", "The demo page", {200: {"text/html": _BYTES}}, public=True),
    Operation(
        "GET",
        DEMO_FILES_PREFIX + "{name}",
        "Pages",
        "The demo page's modules and styles",
        {200: _demo_media},
        (404,),
        public=True,
        parameters=(_path_parameter("name", "A file of the demo page."),),
    ),
    Operation("GET", OPENAPI_PATH, "Pages", "This document", {200: _json({"type": "object"})}, public=True),
    Operation("GET", DOCS_PATH, "Pages", "This document as a page", {200: {"text/html": _BYTES}}, public=True),
)


def _error_codes(status: int) -> str:
    codes = [code.value for code in ErrorCode if code.http_status == status]
    return ", ".join(codes) if codes else "-"


def _responses(operation: Operation, app: web.Application) -> dict[str, Any]:
    config = app[CONFIG_KEY]
    responses: dict[str, Any] = {}
    for status, made in operation.ok.items():
        content = made(app) if callable(made) else made
        answer: dict[str, Any] = {"description": "Switching Protocols" if status == 101 else "Success"}
        if content:
            answer["content"] = {media: {"schema": schema} for media, schema in content.items()}
        responses[str(status)] = answer
    statuses = set(operation.errors)
    if not operation.public:
        statuses |= {401, 403} if config.transport.api_keys or config.transport.allowed_origins else set()
    if operation.body is not None:
        statuses.add(400)
    for status in sorted(statuses):
        # The handler's errors in its API's shape; the server's own (keys, origins, routing) in voxwire's.
        schema = (
            _ref("Error") if operation.shape is ErrorShape.VOXWIRE else {"anyOf": [_ref("NanoError"), _ref("Error")]}
        )
        description = f"Error (codes: {_error_codes(status)})"
        responses[str(status)] = {"description": description, "content": {_JSON: {"schema": schema}}}
    return responses


def _request_body(model: RequestModel) -> dict[str, Any]:
    media = "multipart/form-data" if model.form else _JSON
    return {"required": True, "content": {media: {"schema": _ref(model.name)}}}


def openapi_document(app: web.Application) -> dict[str, Any]:
    """The document of ``app``'s routes, with its configuration's limits; routes it lacks (the demo page without
    ``client_js/``) are left out."""
    config = app[CONFIG_KEY]
    registered = {(route.method, route.resource.canonical) for route in app.router.routes() if route.resource}
    paths: dict[str, dict[str, Any]] = {}
    for operation in OPERATIONS:
        if (operation.method, operation.path) not in registered:
            continue
        entry: dict[str, Any] = {
            "tags": [operation.tag],
            "summary": operation.summary,
            "operationId": f"{operation.method.lower()}{operation.path.replace('/', '_').replace('.', '_')}",
            "responses": _responses(operation, app),
        }
        if operation.description:
            entry["description"] = operation.description
        if operation.parameters:
            entry["parameters"] = list(operation.parameters)
        if operation.body is not None:
            entry["requestBody"] = _request_body(operation.body)
        if operation.public:
            entry["security"] = []
        paths.setdefault(operation.path, {})[operation.method.lower()] = entry
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "voxwire",
            "version": __version__,
            "description": "Real-time text-to-speech for VoxCPM: OpenAI's speech API, Nano-vLLM-VoxCPM's API, "
            "saved voices, LoRA personas and a streaming WebSocket. Errors are "
            '{"error": {"code", "message"}}; the Nano-vLLM-VoxCPM routes answer {"detail": ...} as that API does.',
        },
        "paths": paths,
        "components": {
            "schemas": {
                **SCHEMAS,
                **{model.name: model.json_schema(config) for model in MODELS},
                **elevenlabs_request.json_schemas(config),
            },
        },
    }
    if config.transport.api_keys:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "token": {"type": "apiKey", "in": "query", "name": "token"},
        }
        document["security"] = [{"bearer": []}, {"token": []}]
    return document


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(request.app))


async def docs(request: web.Request) -> web.Response:
    return await static_file(DOCS_PAGE, "text/html; charset=utf-8")


def add_openapi_routes(app: web.Application) -> None:
    app.router.add_get(OPENAPI_PATH, openapi_json)
    app.router.add_get(DOCS_PATH, docs)
