"""The HTTP API: OpenAI-compatible ``POST /v1/audio/speech``, voices, probes and metrics, and the error envelope.

Every error leaves as ``{"error": {"code": ..., "message": ...}}``, produced in one place,
``error_middleware``, from an ``ApiError`` or a known library exception. The codes are stable:

=====  ===========================================================================================
400    ``invalid_json``, ``invalid_request`` (shape, types, form parts), ``unknown_field``,
       ``empty_input``, ``text_too_long``, ``unsupported_format``,
       ``unsupported_speed``, ``unsupported_instructions``, ``unsupported_stream_format``,
       ``invalid_parameter`` (seed, cfg_value, inference_timesteps), ``normalize_unavailable``, ``invalid_audio``,
       ``clip_too_long``, ``transcript_required``
401    ``unauthorized``; 403 ``forbidden_origin``; 404 ``not_found``, ``unknown_voice``;
       405 ``method_not_allowed``; 409 ``voice_limit``; 413 ``payload_too_large``, ``upload_too_large``
422    ``synthesis_failed`` (the engine refused the text, e.g. longer than a slot)
503    ``not_ready`` (warming up), ``shutting_down``, ``busy`` (queue full), ``engine_unavailable``;
       a speech request refused before it starts has ``Retry-After`` (a balancer may retry it
       elsewhere, see ``admission.py``); 500 ``internal_error``
=====  ===========================================================================================

Handlers are thin: they parse (``parse_speech``), hand the work to the ``SpeechService`` or the
``VoiceStore``, and stream the result; nothing here touches the model. A speech body is streamed
as it is generated; an utterance that ends early (engine error, shutdown past the drain timeout)
cuts the chunked body short instead of ending it cleanly, so no client mistakes it for a whole one.
HTTP streams rely on TCP backpressure: a stalled reader stalls its handler, and the engine's
per-request channel holds at most that utterance's audio.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import BodyPartReader, hdrs, web
from aiohttp.typedefs import Handler

from voxstream.audio.clip import load_clip
from voxstream.audio.formats import OPENAI_RESPONSE_FORMATS, make_encoder
from voxstream.engine import EngineDeadError, FinishReason, QueueFullError, StepOutput, SynthesisParams
from voxstream.errors import InvalidInputError
from voxstream.serving.admission import RETRY_AFTER_S, refusal
from voxstream.serving.config import ServerConfig
from voxstream.serving.keys import CONFIG_KEY, METRICS_KEY, SERVICE_KEY, STATE_KEY, VOICES_KEY, Phase
from voxstream.serving.voices import UnknownVoiceError, VoiceLimitError
from voxstream.text.normalize import EXTRA_HINT, normalize_in_worker, normalizer_available

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ApiError(Exception):
    """An error for the client: HTTP status, stable code, human message (and optional headers)."""

    def __init__(self, status: int, code: str, message: str, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        body = {"error": {"code": self.code, "message": self.message}}
        return web.json_response(body, status=self.status, headers=self.headers)


_KEPT_HEADERS = frozenset({hdrs.ALLOW, hdrs.RETRY_AFTER})
_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def as_api_error(exc: Exception) -> ApiError | None:
    """The client-facing form of an exception a handler may raise; None for a server bug."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, UnknownVoiceError):
        return ApiError(404, "unknown_voice", str(exc))
    if isinstance(exc, VoiceLimitError):
        return ApiError(409, "voice_limit", str(exc))
    if isinstance(exc, QueueFullError):
        return ApiError(503, "busy", f"the server is at capacity, retry shortly ({exc})", headers={"Retry-After": "1"})
    if isinstance(exc, EngineDeadError):
        return ApiError(503, "engine_unavailable", str(exc))
    if isinstance(exc, InvalidInputError):
        return ApiError(400, "invalid_parameter", str(exc))
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        code = _HTTP_CODES.get(exc.status, f"http_{exc.status}")
        kept = {name: value for name, value in exc.headers.items() if name in _KEPT_HEADERS}  # e.g. 405's Allow
        return ApiError(exc.status, code, exc.reason, headers=kept)
    return None


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into the JSON error envelope, and count it by code."""
    try:
        return await handler(request)
    except Exception as exc:
        error = as_api_error(exc)
        if request.writer is not None and request.writer.output_size > 0:
            raise  # the response has begun: aiohttp can only cut the connection, which tells the client
        if error is None:
            logger.exception("unexpected error in %s %s", request.method, request.path)
            error = ApiError(500, "internal_error", "the server failed to handle this request; see its log")
        request.app[METRICS_KEY].count_error(error.code)
        return error.response()


def add_http_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", create_speech)
    app.router.add_post("/v1/voices", create_voice)
    app.router.add_get("/v1/voices", list_voices)
    app.router.add_delete("/v1/voices/{voice_id}", delete_voice)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)


# ---- probes and metrics ------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    require_accepting(request.app)
    info = request.app[SERVICE_KEY].info
    return web.json_response({"status": "ready", "model": info.name, "sample_rate": info.sample_rate})


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[METRICS_KEY]
    return web.Response(body=registry.exposition(), headers={hdrs.CONTENT_TYPE: registry.content_type})


def require_accepting(app: web.Application) -> None:
    """Raise 503 unless the server takes new work (warmed up, not shutting down)."""
    phase = app[STATE_KEY].phase
    if phase is Phase.STARTING:
        raise ApiError(503, "not_ready", "the model is warming up, retry shortly", headers={"Retry-After": "1"})
    if phase is Phase.DRAINING:
        raise ApiError(503, "shutting_down", "the server is shutting down")


def require_admission(app: web.Application, *, connection: bool) -> None:
    """Raise 503 with ``Retry-After`` unless this replica takes new work now (see ``admission.refusal``)."""
    refused = refusal(app, connection=connection)
    if refused is not None:
        raise ApiError(503, refused.code, refused.message, headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_S)})


# ---- speech ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeechRequest:
    """A validated ``POST /v1/audio/speech`` body."""

    text: str
    voice: str | None
    response_format: str
    params: SynthesisParams
    sse: bool = False
    """``stream_format: "sse"``: the audio as OpenAI's ``speech.audio.delta`` events instead of a raw body."""
    normalize: bool = False
    """Read numbers, dates and money as words before speaking (``voxstream[normalize]``)."""


_SPEECH_FIELDS = frozenset(
    {"model", "input", "voice", "response_format", "speed", "instructions", "stream_format"}
    | {"seed", "cfg_value", "inference_timesteps", "normalize"}  # voxstream extras
)


def parse_speech(body: object, config: ServerConfig) -> SpeechRequest:
    """Validate an OpenAI speech request; every refusal names the field and has its own code."""
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    unknown = sorted(set(body) - _SPEECH_FIELDS)
    if unknown:
        raise ApiError(400, "unknown_field", f"unknown field(s) {unknown}; the fields are {sorted(_SPEECH_FIELDS)}")
    _field(body, "model", str)  # one model is served, whatever its name in the request
    text = _field(body, "input", str)
    if text is None or not text.strip():
        raise ApiError(400, "empty_input", "'input' must be a non-empty string")
    if len(text) > config.max_text_chars_per_utterance:
        limit = config.max_text_chars_per_utterance
        raise ApiError(400, "text_too_long", f"'input' has {len(text)} characters; the limit is {limit}")
    response_format = _field(body, "response_format", str) or "mp3"  # OpenAI's default, which its SDKs rely on
    if response_format not in OPENAI_RESPONSE_FORMATS:
        supported = ", ".join(OPENAI_RESPONSE_FORMATS)
        raise ApiError(400, "unsupported_format", f"response_format {response_format!r} is not served; use {supported}")
    speed = _field(body, "speed", (int, float))
    if speed is not None and speed != 1.0:
        raise ApiError(400, "unsupported_speed", f"speed={speed} is not supported; VoxCPM speaks at its own pace (1.0)")
    if _field(body, "instructions", str):
        raise ApiError(400, "unsupported_instructions", "'instructions' (voice direction prompts) are not supported")
    stream_format = _field(body, "stream_format", str) or "audio"
    if stream_format not in ("audio", "sse"):
        raise ApiError(400, "unsupported_stream_format", "stream_format is 'audio' (a raw body) or 'sse' (events)")
    normalize = body.get("normalize") or False
    if not isinstance(normalize, bool):
        raise ApiError(400, "invalid_request", f"'normalize' has the wrong type ({type(normalize).__name__})")
    if normalize and not normalizer_available():
        raise ApiError(400, "normalize_unavailable", f"'normalize' is not available on this server: {EXTRA_HINT}")
    extras = {name: body[name] for name in ("seed", "cfg_value", "inference_timesteps") if body.get(name) is not None}
    try:
        params = SynthesisParams(**extras)
    except InvalidInputError as exc:
        raise ApiError(400, "invalid_parameter", str(exc)) from exc
    voice = _field(body, "voice", str)
    return SpeechRequest(text, voice, response_format, params, sse=stream_format == "sse", normalize=normalize)


def _field(body: dict[str, object], name: str, kind: type[T] | tuple[type[T], ...]) -> T | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ApiError(400, "invalid_request", f"'{name}' has the wrong type ({type(value).__name__})")
    return value


async def create_speech(request: web.Request) -> web.StreamResponse:
    """OpenAI's ``POST /v1/audio/speech``: the audio streams as a chunked body while it is generated."""
    app = request.app
    require_admission(app, connection=False)
    try:
        body = await request.json()
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from exc
    speech = parse_speech(body, app[CONFIG_KEY])
    voice = app[VOICES_KEY].resolve(speech.voice)
    service = app[SERVICE_KEY]
    text = await normalize_in_worker(speech.text) if speech.normalize else speech.text
    with app[STATE_KEY].utterance():
        outputs = service.speak(service.new_request_id("http"), text, speech.params, voice)
        async with contextlib.aclosing(outputs):
            input_tokens = service.prefill_tokens(text, voice)
            return await _stream_speech(request, speech, outputs, input_tokens=input_tokens)


def _sse_event(event: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def _sse_delta(block: bytes) -> bytes:
    """One encoded block as OpenAI's ``speech.audio.delta`` event (base64 audio)."""
    return _sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(block).decode("ascii")})


def _sse_done(input_tokens: int, output_tokens: int) -> bytes:
    """OpenAI's closing ``speech.audio.done`` event; tokens are prompt positions and generated patches."""
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}
    return _sse_event({"type": "speech.audio.done", "usage": usage})


async def _stream_speech(
    request: web.Request, speech: SpeechRequest, outputs: AsyncGenerator[StepOutput, None], *, input_tokens: int
) -> web.StreamResponse:
    app = request.app
    service, config, metrics = app[SERVICE_KEY], app[CONFIG_KEY], app[METRICS_KEY]
    fmt, rate = OPENAI_RESPONSE_FORMATS[speech.response_format]
    encoder = make_encoder(fmt, service.info.sample_rate, output_rate=rate, bitrate=config.opus_bitrate)
    started = time.perf_counter()
    # Refusals (busy, a parameter over a limit, an unusable text) surface with the first output,
    # while a proper error status can still be sent.
    output = await anext(outputs)
    if output.finish_reason is FinishReason.ERROR:
        raise ApiError(422, "synthesis_failed", f"the engine could not synthesize this input: {output.error}")
    metrics.observe_first_audio(time.perf_counter() - started)
    content_type = "text/event-stream" if speech.sse else encoder.content_type
    frame = _sse_delta if speech.sse else bytes
    response = web.StreamResponse(headers={hdrs.CONTENT_TYPE: content_type})
    response.enable_chunked_encoding()
    await response.prepare(request)
    samples = patches = 0
    try:
        while True:
            samples += output.chunk.size
            patches += int(output.chunk.size > 0)
            for block in encoder.encode(output.chunk):
                await response.write(frame(block))
            if output.finished:
                break
            output = await anext(outputs)
    except (ConnectionResetError, asyncio.CancelledError):
        # aiohttp cancels the handler of a request whose client went away, or a write fails first.
        metrics.count_dropped("client_disconnected")
        raise
    finally:
        metrics.add_audio(samples / service.info.sample_rate)
    reason = output.finish_reason
    assert reason is not None, "the loop ends on the final output"
    metrics.count_utterance(reason.value)
    if reason in (FinishReason.ERROR, FinishReason.ABORTED):
        # Cut the body short (no final chunk) so the client cannot mistake it for a whole utterance.
        metrics.count_dropped("shutdown" if reason is FinishReason.ABORTED else "synthesis_failed")
        raise ConnectionAbortedError(f"utterance ended early: {reason.value} {output.error or ''}")
    for block in encoder.finish():
        await response.write(frame(block))
    if speech.sse:
        await response.write(_sse_done(input_tokens, patches))
    await response.write_eof()
    return response


# ---- voices ------------------------------------------------------------------------------------


async def create_voice(request: web.Request) -> web.Response:
    """``POST /v1/voices`` (multipart: ``file``, optional ``transcript`` and ``name``): encode once, save."""
    app = request.app
    require_accepting(app)  # encoding shares the model with the engine: not during warm-up or shutdown
    config, service = app[CONFIG_KEY], app[SERVICE_KEY]
    if request.content_length is not None and request.content_length > config.max_upload_bytes:
        raise _too_large(config.max_upload_bytes)
    fields = await _read_upload(request, config.max_upload_bytes)
    clip, transcript, name = fields.get("file"), fields.get("transcript"), fields.get("name")
    if clip is None:
        raise ApiError(400, "invalid_request", "the upload needs a 'file' part holding the voice clip")
    # An empty transcript field is the same as none (forms send empty fields).
    text = None if transcript is None else transcript.decode("utf-8", errors="replace").strip() or None
    if text is None and service.info.architecture != "voxcpm2":
        raise ApiError(400, "transcript_required", "this model clones a voice from a clip and its 'transcript'")
    rate = service.info.sample_rate
    try:
        samples = await asyncio.to_thread(load_clip, clip, rate)
    except InvalidInputError as exc:
        raise ApiError(400, "invalid_audio", f"the voice clip is not usable audio: {exc}") from exc
    duration = samples.size / rate
    if duration > config.max_clip_seconds:
        raise ApiError(
            400, "clip_too_long", f"the clip lasts {duration:.1f} s; the limit is {config.max_clip_seconds} s"
        )
    prompt = await service.encode_voice(
        text=text, audio=samples if text else None, reference_audio=None if text else samples, sample_rate=rate
    )
    label = None if name is None else name.decode("utf-8", errors="replace").strip()[:200]
    info = await app[VOICES_KEY].add(prompt, name=label, duration_s=duration)
    return web.json_response(info.to_json(), status=201)


async def list_voices(request: web.Request) -> web.Response:
    infos = request.app[VOICES_KEY].infos()
    return web.json_response({"object": "list", "data": [info.to_json() for info in infos]})


async def delete_voice(request: web.Request) -> web.Response:
    voice_id = request.match_info["voice_id"]
    await request.app[VOICES_KEY].delete(voice_id)
    return web.json_response({"id": voice_id, "object": "voice", "deleted": True})


_UPLOAD_PARTS = ("file", "transcript", "name")


async def _read_upload(request: web.Request, limit: int) -> dict[str, bytes]:
    """The parts of a multipart upload by name, reading at most ``limit`` bytes in all."""
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError) as exc:  # aiohttp asserts on a non-multipart content type
        raise ApiError(400, "invalid_request", "send the voice as multipart/form-data") from exc
    fields: dict[str, bytes] = {}
    total = 0
    async for part in reader:
        if not isinstance(part, BodyPartReader) or part.name not in _UPLOAD_PARTS:
            raise ApiError(400, "invalid_request", f"unexpected form part; the parts are {', '.join(_UPLOAD_PARTS)}")
        data = bytearray()
        while chunk := await part.read_chunk():
            total += len(chunk)
            if total > limit:
                raise _too_large(limit)
            data += chunk
        fields[part.name] = bytes(data)
    return fields


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "upload_too_large", f"the upload exceeds the limit of {limit} bytes")
