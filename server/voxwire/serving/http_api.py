"""The HTTP API: OpenAI-compatible ``POST /v1/audio/speech``, voices, probes and metrics, and the error envelope.

Every error leaves as ``{"error": {"code": ..., "message": ...}}``, produced in one place,
``error_middleware``, from an ``ApiError`` or a known library exception. The codes are stable and
shared with the WebSocket protocol: ``error_codes.ErrorCode`` lists them with each one's HTTP status. A
speech request refused before it starts (``not_ready``, ``shutting_down``, ``busy``) has ``Retry-After``
(a balancer may retry it elsewhere, see ``admission.py``).

Handlers are thin: they parse (``parse_speech``), hand the work to the ``SpeechService`` or the
``VoiceStore``, and stream the result; nothing here touches the model. A speech body is streamed
as it is generated; an utterance that ends early (engine error, shutdown past the drain timeout)
cuts the chunked body short instead of ending it cleanly, so no client mistakes it for a whole one.
HTTP streams rely on TCP backpressure: a stalled reader stalls its handler, and the engine's
per-request channel holds at most that utterance's audio. A client that leaves (mid-body or
mid-stream) is counted as a dropped session and logged at INFO: it is not a server error.
Request bodies are bounded in size (``client_max_size``, ``max_upload_bytes``) and in time
(``body_timeout_s``), and every text field is checked against its limit before any work.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import unicodedata
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import BodyPartReader, hdrs, web
from aiohttp.typedefs import Handler

from voxwire.audio.clip import ClipTooLongError, load_clip
from voxwire.audio.formats import OPENAI_RESPONSE_FORMATS, StreamEncoder, make_encoder
from voxwire.engine import Chunk, FinishReason, SynthesisParams
from voxwire.errors import InvalidInputError
from voxwire.serving.admission import RETRY_AFTER_S, refusal
from voxwire.serving.config import ServerConfig
from voxwire.serving.error_codes import ErrorCode
from voxwire.serving.keys import (
    CONFIG_KEY,
    ENCODERS_KEY,
    METRICS_KEY,
    OWNER_KEY,
    SERVICE_KEY,
    STATE_KEY,
    VOICES_KEY,
    Phase,
)
from voxwire.serving.personas import PersonaLoadError, Personas, UnknownPersonaError
from voxwire.serving.service import SpeechFailure, UtteranceOptions
from voxwire.serving.voices import UnknownVoiceError, VoiceLimitError, VoiceOwnerError
from voxwire.text.normalize import EXTRA_HINT, normalize_in_worker, normalizer_available

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ApiError(Exception):
    """An error for the client: stable code (which states the HTTP status), human message (and optional headers).

    ``status`` overrides the code's status only where an API answers otherwise: an aiohttp HTTP error with no
    code of its own, and the Nano-vLLM API's 400 for every LoRA refusal.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        close_connection: bool = False,
    ) -> None:
        super().__init__(message)
        status = status or code.http_status
        if status is None:
            raise ValueError(f"{code.value!r} is a WebSocket-only error code; it has no HTTP status")
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.close_connection = close_connection
        """The connection cannot carry another request (e.g. a body was left half-read): close it after this."""

    def response(self) -> web.Response:
        body = {"error": {"code": self.code.value, "message": self.message}}
        response = web.json_response(body, status=self.status, headers=self.headers)
        if self.close_connection:
            response.force_close()
        return response


_KEPT_HEADERS = frozenset({hdrs.ALLOW, hdrs.RETRY_AFTER})
_AIOHTTP_CODES = (
    ErrorCode.INVALID_REQUEST,
    ErrorCode.NOT_FOUND,
    ErrorCode.METHOD_NOT_ALLOWED,
    ErrorCode.PAYLOAD_TOO_LARGE,
)
_HTTP_CODES = {code.http_status: code for code in _AIOHTTP_CODES}
"""The code of each aiohttp HTTP error the server can raise (an unknown route, a method, a body over the limit)."""


def as_api_error(exc: Exception) -> ApiError | None:
    """The client-facing form of an exception a handler may raise; None for a server bug."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, UnknownVoiceError):
        return ApiError(ErrorCode.UNKNOWN_VOICE, str(exc))
    if isinstance(exc, VoiceLimitError):
        return ApiError(ErrorCode.VOICE_LIMIT, str(exc))
    if isinstance(exc, VoiceOwnerError):
        return ApiError(ErrorCode.FORBIDDEN, str(exc))
    if isinstance(exc, UnknownPersonaError):
        return ApiError(ErrorCode.UNKNOWN_PERSONA, str(exc))
    if isinstance(exc, PersonaLoadError):
        return ApiError(ErrorCode(exc.code), str(exc))
    if isinstance(exc, SpeechFailure):
        retry = {hdrs.RETRY_AFTER: str(RETRY_AFTER_S)} if exc.code is ErrorCode.BUSY else None
        return ApiError(exc.code, str(exc), headers=retry)
    if isinstance(exc, InvalidInputError):
        return ApiError(ErrorCode.INVALID_PARAMETER, str(exc))
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        # Another status (none the server raises today) keeps its status under the generic code of its class.
        generic = ErrorCode.INVALID_REQUEST if exc.status < 500 else ErrorCode.INTERNAL_ERROR
        code = _HTTP_CODES.get(exc.status, generic)
        kept = {name: value for name, value in exc.headers.items() if name in _KEPT_HEADERS}  # e.g. 405's Allow
        return ApiError(code, exc.reason, status=exc.status, headers=kept)
    return None


CLIENT_CLOSED_STATUS = 499
"""Status logged for a request whose client left before the response (nothing reaches the client)."""


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into the JSON error envelope, and count it by code."""
    try:
        return await handler(request)
    except asyncio.CancelledError:
        # aiohttp may cancel the handler when its client leaves mid-body, instead of failing the read (which
        # happens depends on timing and on what else patched asyncio in the process): the same departure.
        if _client_gone(request):
            _count_departure(request, "cancelled")
        raise
    except Exception as exc:
        if isinstance(exc, ConnectionError) and _client_gone(request):
            _count_departure(request, exc)
            return web.Response(status=CLIENT_CLOSED_STATUS)
        error = as_api_error(exc)
        if request.writer is not None and request.writer.output_size > 0:
            raise  # the response has begun: aiohttp can only cut the connection, which tells the client
        if error is None:
            logger.exception("unexpected error in %s %s", request.method, request.path)
            error = ApiError(ErrorCode.INTERNAL_ERROR, "the server failed to handle this request; see its log")
        request.app[METRICS_KEY].count_error(error.code.value)
        return error.response()


def _count_departure(request: web.Request, cause: object) -> None:
    logger.info("client left during %s %s: %s", request.method, request.path, cause)
    if request.writer is None or request.writer.output_size == 0:  # a stream counts its own drop
        request.app[METRICS_KEY].count_dropped("client_disconnected")


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def add_http_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", create_speech)
    app.router.add_post("/v1/voices", create_voice)
    app.router.add_get("/v1/voices", list_voices)
    app.router.add_delete("/v1/voices/{voice_id}", delete_voice)
    app.router.add_post("/v1/loras", create_lora)
    app.router.add_get("/v1/loras", list_loras)
    app.router.add_delete("/v1/loras/{name}", delete_lora)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)


# ---- probes and metrics ------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    require_accepting(request.app)
    # Public: nothing about the deployment (the model's source may be a local path).
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[METRICS_KEY]
    return web.Response(body=registry.exposition(), headers={hdrs.CONTENT_TYPE: registry.content_type})


def require_accepting(app: web.Application) -> None:
    """Raise 503 unless the server takes new work (warmed up, not shutting down)."""
    phase = app[STATE_KEY].phase
    if phase is Phase.STARTING:
        raise ApiError(ErrorCode.NOT_READY, "the model is warming up, retry shortly", headers={"Retry-After": "1"})
    if phase is Phase.DRAINING:
        raise ApiError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")


def require_admission(app: web.Application, *, connection: bool) -> None:
    """Raise 503 with ``Retry-After`` unless this replica takes new work now (see ``admission.refusal``)."""
    refused = refusal(app, connection=connection)
    if refused is not None:
        raise ApiError(refused.code, refused.message, headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_S)})


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
    """Read numbers, dates and money as words before speaking (``voxwire[normalize]``)."""
    persona: str | None = None
    """A LoRA persona loaded on the server; None is the base model."""


_SPEECH_FIELDS = frozenset(
    {"model", "input", "voice", "response_format", "speed", "instructions", "stream_format"}
    | {"seed", "cfg_value", "inference_timesteps", "normalize", "persona"}  # voxwire extras
)


def parse_speech(body: object, config: ServerConfig) -> SpeechRequest:
    """Validate an OpenAI speech request; every refusal names the field and has its own code."""
    if not isinstance(body, dict):
        raise ApiError(ErrorCode.INVALID_REQUEST, "the body must be a JSON object")
    unknown = sorted(set(body) - _SPEECH_FIELDS)
    if unknown:
        raise ApiError(ErrorCode.UNKNOWN_FIELD, f"unknown field(s) {unknown}; the fields are {sorted(_SPEECH_FIELDS)}")
    _field(body, "model", str)  # one model is served, whatever its name in the request
    text = _field(body, "input", str)
    if text is None or not text.strip():
        raise ApiError(ErrorCode.EMPTY_INPUT, "'input' must be a non-empty string")
    if len(text) > config.max_text_chars_per_utterance:
        limit = config.max_text_chars_per_utterance
        raise ApiError(ErrorCode.TEXT_TOO_LONG, f"'input' has {len(text)} characters; the limit is {limit}")
    response_format = _field(body, "response_format", str) or "mp3"  # OpenAI's default, which its SDKs rely on
    if response_format not in OPENAI_RESPONSE_FORMATS:
        supported = ", ".join(OPENAI_RESPONSE_FORMATS)
        raise ApiError(
            ErrorCode.UNSUPPORTED_FORMAT, f"response_format {response_format!r} is not served; use {supported}"
        )
    speed = _field(body, "speed", (int, float))
    if speed is not None and speed != 1.0:
        raise ApiError(
            ErrorCode.UNSUPPORTED_SPEED, f"speed={speed} is not supported; VoxCPM speaks at its own pace (1.0)"
        )
    if _field(body, "instructions", str):
        raise ApiError(ErrorCode.UNSUPPORTED_INSTRUCTIONS, "'instructions' (voice direction prompts) are not supported")
    stream_format = _field(body, "stream_format", str) or "audio"
    if stream_format not in ("audio", "sse"):
        raise ApiError(ErrorCode.UNSUPPORTED_STREAM_FORMAT, "stream_format is 'audio' (a raw body) or 'sse' (events)")
    normalize = body.get("normalize") or False
    if not isinstance(normalize, bool):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'normalize' has the wrong type ({type(normalize).__name__})")
    if normalize and not normalizer_available():
        raise ApiError(ErrorCode.NORMALIZE_UNAVAILABLE, f"'normalize' is not available on this server: {EXTRA_HINT}")
    extras = {name: body[name] for name in ("seed", "cfg_value", "inference_timesteps") if body.get(name) is not None}
    try:
        params = SynthesisParams(**extras)
        config.engine_config().limits.check(params)  # this server's limits, before any work (as a WebSocket start)
    except ValueError as exc:
        raise ApiError(ErrorCode.INVALID_PARAMETER, str(exc)) from exc
    voice = _field(body, "voice", str)
    persona = _field(body, "persona", str)
    sse = stream_format == "sse"
    return SpeechRequest(text, voice, response_format, params, sse=sse, normalize=normalize, persona=persona)


async def read_json(request: web.Request, timeout_s: float, max_bytes: int | None = None) -> object:
    """The request body as JSON, read within ``timeout_s``, decoded in its declared charset (UTF-8 by default);
    ``max_bytes`` replaces the application's body limit for this route (413 ``payload_too_large`` beyond it).

    Raises ``ApiError`` for a slow body (408), an unknown charset, undecodable text, invalid JSON or JSON
    nested too deeply for the parser (all 400 ``invalid_json``), never a server error.
    """
    data = await _within(timeout_s, request.read() if max_bytes is None else _read_at_most(request, max_bytes))
    charset = request.charset or "utf-8"
    try:
        text = data.decode(charset)
    except LookupError as exc:
        raise ApiError(ErrorCode.INVALID_JSON, f"unknown charset {charset!r}; send UTF-8") from exc
    except UnicodeDecodeError as exc:
        raise ApiError(ErrorCode.INVALID_JSON, f"the body is not valid {charset}: {exc}") from exc
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise ApiError(ErrorCode.INVALID_JSON, "the JSON is nested too deeply") from exc
    except ValueError as exc:
        raise ApiError(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {exc}") from exc


async def _read_at_most(request: web.Request, limit: int) -> bytes:
    too_large = ApiError(ErrorCode.PAYLOAD_TOO_LARGE, f"the body exceeds {limit} bytes", close_connection=True)
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    data = bytearray()
    async for chunk in request.content.iter_chunked(64 * 1024):
        data += chunk
        if len(data) > limit:
            raise too_large
    return bytes(data)


async def _within(timeout_s: float, read: Awaitable[T]) -> T:
    """Await a body read, refusing a client too slow to send it (408 ``body_timeout``)."""
    try:
        return await asyncio.wait_for(read, timeout_s)
    except asyncio.TimeoutError as exc:  # not the builtin before Python 3.11
        message = f"the request body did not arrive within {timeout_s:g} s"
        raise ApiError(ErrorCode.BODY_TIMEOUT, message, close_connection=True) from exc


def _field(body: dict[str, object], name: str, kind: type[T] | tuple[type[T], ...]) -> T | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{name}' has the wrong type ({type(value).__name__})")
    return value


async def create_speech(request: web.Request) -> web.StreamResponse:
    """OpenAI's ``POST /v1/audio/speech``: the audio streams as a chunked body while it is generated."""
    app = request.app
    require_admission(app, connection=False)
    body = await read_json(request, app[CONFIG_KEY].body_timeout_s)
    speech = parse_speech(body, app[CONFIG_KEY])
    voice = app[VOICES_KEY].resolve(speech.voice)
    service = app[SERVICE_KEY]
    service.check_persona(speech.persona)
    text = await normalize_in_worker(speech.text) if speech.normalize else speech.text
    with app[STATE_KEY].utterance():
        options = UtteranceOptions(speech.persona)
        outputs = service.speak(service.new_request_id("http"), text, speech.params, voice, options)
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
    request: web.Request, speech: SpeechRequest, outputs: AsyncGenerator[Chunk, None], *, input_tokens: int
) -> web.StreamResponse:
    app = request.app
    service, config = app[SERVICE_KEY], app[CONFIG_KEY]
    fmt, rate = OPENAI_RESPONSE_FORMATS[speech.response_format]
    opus = config.opus_settings()
    encoder = make_encoder(
        fmt, service.info.sample_rate, output_rate=rate, bitrate=opus.bitrate, complexity=opus.complexity
    )
    content_type = "text/event-stream" if speech.sse else encoder.content_type
    frame = _sse_delta if speech.sse else bytes
    response, patches = await stream_audio(request, outputs, encoder, {hdrs.CONTENT_TYPE: content_type}, frame)
    if speech.sse:
        await response.write(_sse_done(input_tokens, patches))
    await response.write_eof()
    return response


async def stream_audio(
    request: web.Request,
    outputs: AsyncGenerator[Chunk, None],
    encoder: StreamEncoder,
    headers: Mapping[str, str],
    frame: Callable[[bytes], bytes] = bytes,
) -> tuple[web.StreamResponse, int]:
    """Stream an utterance's encoded audio as a chunked body, each encoded block through ``frame``; the response
    (not ended yet: the caller may add a trailer, then ``write_eof``) and the patches generated."""
    app = request.app
    metrics, encoders = app[METRICS_KEY], app[ENCODERS_KEY]
    rate = app[SERVICE_KEY].info.sample_rate
    started = time.perf_counter()
    # Refusals (busy, a parameter over a limit, an unusable text) surface with the first output,
    # while a proper error status can still be sent.
    output = await anext(outputs)  # a SpeechFailure here becomes its error response
    metrics.observe_first_audio(time.perf_counter() - started)
    response = web.StreamResponse(headers=headers)
    response.enable_chunked_encoding()
    await response.prepare(request)
    samples = patches = 0
    try:
        while True:
            samples += output.audio.size
            patches += int(output.audio.size > 0)
            for block in await encoders.encode(encoder, output.audio):
                await response.write(frame(block))
            if output.finished:
                break
            output = await anext(outputs)
    except (ConnectionResetError, asyncio.CancelledError):
        # aiohttp cancels the handler of a request whose client went away, or a write fails first.
        metrics.count_dropped("client_disconnected")
        raise
    except SpeechFailure as exc:
        # Cut the body short (no final chunk) so the client cannot mistake it for a whole utterance.
        if exc.finish is not None:
            metrics.count_utterance(exc.finish.value)
        metrics.count_dropped("shutdown" if exc.finish is FinishReason.ABORTED else exc.code.value)
        raise ConnectionAbortedError(f"utterance ended early: {exc.code.value}: {exc}") from exc
    finally:
        metrics.add_audio(samples / rate)
    reason = output.finish_reason
    assert reason is not None, "the loop ends on the final output"
    metrics.count_utterance(reason.value)
    for block in await encoders.finish(encoder):
        await response.write(frame(block))
    return response, patches


# ---- voices ------------------------------------------------------------------------------------


async def create_voice(request: web.Request) -> web.Response:
    """``POST /v1/voices`` (multipart: ``file``, optional ``transcript`` and ``name``): encode once, save.

    Cheap checks first: sizes while the body is read, the text fields, then the clip's header (its duration)
    before it is decoded, and the decoded audio and its latents must be finite before the voice is kept.
    """
    app = request.app
    require_accepting(app)  # encoding shares the model with the engine: not during warm-up or shutdown
    config, service = app[CONFIG_KEY], app[SERVICE_KEY]
    if request.content_length is not None and request.content_length > config.max_upload_bytes:
        raise _too_large(config.max_upload_bytes)
    fields = await _within(config.body_timeout_s, _read_upload(request, config))
    clip = fields.get("file")
    if clip is None:
        raise ApiError(ErrorCode.INVALID_REQUEST, "the upload needs a 'file' part holding the voice clip")
    # An empty transcript field is the same as none (forms send empty fields).
    text = _text_part(fields, "transcript", config.max_transcript_chars) or None
    name = _text_part(fields, "name", config.max_voice_name_chars)
    check_voice_name(name)
    if text is None and not service.info.reference_cloning:
        raise ApiError(ErrorCode.TRANSCRIPT_REQUIRED, "this model clones a voice from a clip and its 'transcript'")
    rate = service.info.sample_rate
    try:
        samples = await asyncio.to_thread(load_clip, clip, rate, max_seconds=config.max_clip_seconds)
        prompt = await service.encode_voice(
            text=text, audio=samples if text else None, reference_audio=None if text else samples, sample_rate=rate
        )
    except ClipTooLongError as exc:
        raise ApiError(ErrorCode.CLIP_TOO_LONG, str(exc)) from exc
    except InvalidInputError as exc:
        raise ApiError(ErrorCode.INVALID_AUDIO, f"the voice clip is not usable audio: {exc}") from exc
    owner = request.get(OWNER_KEY)
    info = await app[VOICES_KEY].add(prompt, name=name or None, duration_s=samples.size / rate, owner=owner)
    return web.json_response(info.to_json(), status=201)


def check_voice_name(name: str | None) -> None:
    """Refuse control and format characters (newlines, escapes, bidirectional overrides) in a voice's name:
    it is shown in listings and UIs, where they could forge lines or reorder text."""
    if name and any(unicodedata.category(char) in _CONTROL_CATEGORIES for char in name):
        raise ApiError(ErrorCode.INVALID_NAME, "a voice name may not contain control or formatting characters")


_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def _text_part(fields: dict[str, bytes], part: str, limit: int) -> str:
    """A text form part, stripped ("" when absent); UTF-8, at most ``limit`` characters."""
    data = fields.get(part)
    if data is None:
        return ""
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{part}' is not UTF-8 text") from exc
    if len(text) > limit:
        raise ApiError(ErrorCode.TEXT_TOO_LONG, f"'{part}' has {len(text)} characters; the limit is {limit}")
    return text


async def list_voices(request: web.Request) -> web.Response:
    infos = request.app[VOICES_KEY].infos()
    return web.json_response({"object": "list", "data": [info.to_json() for info in infos]})


async def delete_voice(request: web.Request) -> web.Response:
    voice_id = request.match_info["voice_id"]
    await request.app[VOICES_KEY].delete(voice_id, owner=request.get(OWNER_KEY))
    return web.json_response({"id": voice_id, "object": "voice", "deleted": True})


_UPLOAD_PARTS = ("file", "transcript", "name")
_UTF8_BYTES_PER_CHAR = 4


async def _read_upload(request: web.Request, config: ServerConfig) -> dict[str, bytes]:
    """The parts of a multipart upload by name: at most ``max_upload_bytes`` in all, and a text part at most
    the bytes its character limit allows (so an oversized transcript is refused while it is read)."""
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError) as exc:  # aiohttp asserts on a non-multipart content type
        raise ApiError(ErrorCode.INVALID_REQUEST, "send the voice as multipart/form-data") from exc
    part_limits = {
        "file": config.max_upload_bytes,
        "transcript": _UTF8_BYTES_PER_CHAR * config.max_transcript_chars + _PART_SLACK,
        "name": _UTF8_BYTES_PER_CHAR * config.max_voice_name_chars + _PART_SLACK,
    }
    fields: dict[str, bytes] = {}
    total = 0
    async for part in reader:
        if not isinstance(part, BodyPartReader) or part.name not in _UPLOAD_PARTS or part.name in fields:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"unexpected form part; the parts are {', '.join(_UPLOAD_PARTS)}")
        data = bytearray()
        while chunk := await part.read_chunk():
            total += len(chunk)
            if total > config.max_upload_bytes:
                raise _too_large(config.max_upload_bytes)
            data += chunk
            if len(data) > part_limits[part.name]:
                limit = config.max_transcript_chars if part.name == "transcript" else config.max_voice_name_chars
                raise ApiError(ErrorCode.TEXT_TOO_LONG, f"'{part.name}' is longer than the limit of {limit} characters")
        fields[part.name] = bytes(data)
    return fields


_PART_SLACK = 1024
"""Bytes a text part may carry beyond its characters' UTF-8 (surrounding whitespace, stripped later)."""


def _too_large(limit: int) -> ApiError:
    return ApiError(ErrorCode.UPLOAD_TOO_LARGE, f"the upload exceeds the limit of {limit} bytes")


# ---- personas (LoRA adapters) ------------------------------------------------------------------


async def create_lora(request: web.Request) -> web.Response:
    """``POST /v1/loras`` ``{"name", "path"}``: load a LoRA checkpoint folder on the server as a persona."""
    app = request.app
    require_accepting(app)  # loading shares the model with the engine: not during warm-up or shutdown
    body = await read_json(request, app[CONFIG_KEY].body_timeout_s)
    if not isinstance(body, dict):
        raise ApiError(ErrorCode.INVALID_REQUEST, "the body must be a JSON object")
    unknown = sorted(set(body) - {"name", "path"})
    if unknown:
        raise ApiError(ErrorCode.UNKNOWN_FIELD, f"unknown field(s) {unknown}; the fields are ['name', 'path']")
    name, path = _field(body, "name", str), _field(body, "path", str)
    if name is None or path is None:
        raise ApiError(ErrorCode.INVALID_REQUEST, "the body needs 'name' and 'path' (a LoRA folder on the server)")
    info = await persona_registry(app).add(name, path)
    return web.json_response(info.to_json(), status=201)


async def list_loras(request: web.Request) -> web.Response:
    infos = await persona_registry(request.app).infos()
    return web.json_response({"object": "list", "data": [info.to_json() for info in infos]})


async def delete_lora(request: web.Request) -> web.Response:
    """Requests already speaking with the persona finish with it; new ones get ``unknown_persona``."""
    name = request.match_info["name"]
    await persona_registry(request.app).remove(name)
    return web.json_response({"name": name, "object": "lora", "deleted": True})


def persona_registry(app: web.Application) -> Personas:
    """The server's personas; 400 ``personas_unavailable`` where there are none (``--model sim``)."""
    personas = app[SERVICE_KEY].personas
    if personas is None:
        message = "this server cannot serve LoRA personas (they need a checkpoint model)"
        raise ApiError(ErrorCode.PERSONAS_UNAVAILABLE, message)
    return personas
