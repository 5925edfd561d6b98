"""OpenAI's ``POST /v1/audio/speech``: parse, admit, speak, and stream the audio as a body or as SSE events.

``instructions`` and the voice name design the voice on VoxCPM2 (``serving/speech/voice_design.py``; the whole input
is one request, the designed text the reference's ``(control)text``); ``speed`` changes the tempo of the encoded
audio, pitch kept (``audio/tempo.py``).

Clients of other OpenAI-compatible servers are served as they send: fields of theirs that map are honoured
(``stream``, ``sample_rate``, ``ref_audio`` and ``ref_text``, ``voice`` as ``{"id": ...}``, ``mulaw``/``alaw``),
the others accepted without effect and named in ``X-Voxwire-Ignored-Fields`` (and ``voxwire_ignored_fields_total``),
unless the server runs with ``--strict-fields``, which refuses fields it does not know (``unknown_field``).

Handlers are thin: they parse (``parse_speech``), hand the work to the ``Speaker``, and stream the result
(``stream.stream_audio``, or ``stream.whole_audio`` for ``stream: false``); nothing here touches the model. A
speech request refused before it starts (``not_ready``, ``shutting_down``, ``busy``) has ``Retry-After`` (a balancer
may retry it elsewhere, see ``admission``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web

from voxwire.audio.formats import OPENAI_RESPONSE_FORMATS, make_encoder, output_rates
from voxwire.engine import Chunk, Priority, SynthesisParams
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.admission import require_admission
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.http.body import read_json, speech_body_limit
from voxwire.serving.http.inline_clip import inline_voice
from voxwire.serving.http.openai_voices import add_openai_voice_routes
from voxwire.serving.http.priority import request_priority
from voxwire.serving.http.request_models import SPEECH
from voxwire.serving.http.stream import stream_audio, whole_audio
from voxwire.serving.runtime.keys import (
    CONFIG_KEY,
    METRICS_KEY,
    OWNER_KEY,
    SPEAKER_KEY,
    STATE_KEY,
    VOICES_KEY,
)
from voxwire.serving.runtime.metrics import OTHER_FIELD
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.persona_names import check_persona, client_owner
from voxwire.serving.speech.service import SpeechJob, UtteranceOptions
from voxwire.serving.speech.voice_design import DesignRefused, utterance_control
from voxwire.text.design import designed_text
from voxwire.text.normalize import EXTRA_HINT, normalize_in_worker, normalizer_available


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
    instructions: str | None = None
    """OpenAI's voice direction: VoxCPM2's voice design (``serving/speech/voice_design.py``)."""
    speed: float = 1.0
    """Speaking speed in [0.25, 4.0], pitch kept."""
    priority: Priority | None = None
    """The body's ``priority``; None: it names none (the ``Voxwire-Priority`` header may, ``http/priority.py``)."""
    sample_rate: int | None = None
    """The audio's rate; None: the format's own (``OPENAI_RESPONSE_FORMATS``)."""
    whole: bool = False
    """``stream: false``: one file with its real sizes, sent once the utterance has finished."""
    ref_audio: str | None = None
    """A voice clip for this request (base64, ``inline_clip``; ``ref_audio`` or ``references``), in place of
    ``voice``."""
    ref_text: str | None = None
    """What ``ref_audio`` says."""
    ignored: tuple[str, ...] = ()
    """The body's fields that had no effect, sorted (``X-Voxwire-Ignored-Fields``)."""


def parse_speech(body: object, config: ServerConfig) -> SpeechRequest:
    """Validate an OpenAI speech request against ``request_models.SPEECH`` (the schema ``/openapi.json``
    publishes); every refusal names the field and has its own code."""
    given = SPEECH.parse(body, config)
    fields = {**SPEECH.defaults(), **given}
    normalize = fields["normalize"]
    if normalize and not normalizer_available():
        raise ApiError(ErrorCode.NORMALIZE_UNAVAILABLE, f"'normalize' is not available on this server: {EXTRA_HINT}")
    sse, whole = fields["stream_format"] == "sse", not fields["stream"]
    if sse and whole:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'stream': false asks for one whole file; sse events are a stream")
    fmt, _ = OPENAI_RESPONSE_FORMATS[fields["response_format"]]
    rate = given.get("sample_rate")
    if rate is not None and rate not in (rates := output_rates(fmt)):
        taken = f"{min(rates)} to {max(rates)}" if isinstance(rates, range) else ", ".join(map(str, sorted(rates)))
        message = f"'sample_rate'={rate}: {fields['response_format']} is served at {taken} Hz"
        raise ApiError(ErrorCode.INVALID_PARAMETER, message)
    ref_audio, ref_text = _inline_clip(given)
    # Fields another server defines that do nothing here, and the voice a request's own clip replaces.
    without_effect = {*SPEECH.ignored(body, config), *(("voice",) if ref_audio and "voice" in given else ())}
    if ref_audio is None and "ref_text" in given:
        without_effect.add("ref_text")
    # Within this server's limits (the model checks them, as a WebSocket start's are checked).
    params = SynthesisParams(
        **{name: given[name] for name in ("seed", "cfg_value", "inference_timesteps") if name in given}
    )
    return SpeechRequest(
        fields["input"], fields.get("voice"), fields["response_format"], params, sse=sse,
        normalize=normalize, persona=fields.get("persona"), instructions=fields.get("instructions"),
        speed=float(fields["speed"]), priority=None if "priority" not in given else Priority(given["priority"]),
        sample_rate=rate, whole=whole, ref_audio=ref_audio, ref_text=ref_text,
        ignored=tuple(sorted(without_effect)),
    )  # fmt: skip


def _inline_clip(given: dict[str, Any]) -> tuple[str | None, str | None]:
    """The request's own clip and its transcript: vLLM-Omni's ``ref_audio`` and ``ref_text``, or fish-speech's one
    ``references`` item (an empty list, fish-speech's default, is none)."""
    references = given.get("references") or []
    if not references:
        return given.get("ref_audio"), given.get("ref_text")
    if "ref_audio" in given or "ref_text" in given:
        raise ApiError(ErrorCode.INVALID_REQUEST, "send the clip as 'references' or as 'ref_audio', not both")
    return references[0]["audio"], references[0]["text"]


IGNORED_FIELDS_HEADER = "X-Voxwire-Ignored-Fields"
MAX_LISTED_FIELDS = 32
"""Fields ``X-Voxwire-Ignored-Fields`` names at most (a body may have thousands); more are summed up as ``other``."""
_LISTED_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
"""A field name the header shows as it is; any other (a control character, a kilobyte of text) as ``other``."""


def ignored_fields_header(ignored: tuple[str, ...]) -> str:
    """``X-Voxwire-Ignored-Fields``' value: the ignored fields' names, comma-separated; names no header should carry
    (and any beyond ``MAX_LISTED_FIELDS``) once as ``other``."""
    plain = [name for name in ignored if _LISTED_NAME.fullmatch(name)][:MAX_LISTED_FIELDS]
    return ", ".join([*plain, *((OTHER_FIELD,) if len(plain) < len(ignored) else ())])


def _count_ignored(request: web.Request, ignored: tuple[str, ...]) -> None:
    metrics = request.app[METRICS_KEY]
    for name in ignored:
        metrics.count_ignored_field(name if name in SPEECH.fields else OTHER_FIELD)


async def create_speech(request: web.Request) -> web.StreamResponse:
    """OpenAI's ``POST /v1/audio/speech``: the audio streams as a chunked body while it is generated (or, for
    ``stream: false``, comes as one file once it has been)."""
    app = request.app
    require_admission(app, connection=False)
    config = app[CONFIG_KEY]
    body = await read_json(request, config.limits.body_timeout_s, speech_body_limit(config))
    speech = parse_speech(body, config)
    _count_ignored(request, speech.ignored)
    voice = (
        app[VOICES_KEY].resolve(speech.voice)
        if speech.ref_audio is None
        else await inline_voice(app, speech.ref_audio, speech.ref_text, field="ref_audio")
    )
    service = app[SPEAKER_KEY]
    try:
        control = utterance_control(service.info, app[VOICES_KEY].canonical(speech.voice), voice, speech.instructions)
    except DesignRefused as exc:
        raise ApiError(ErrorCode.UNSUPPORTED, str(exc)) from None
    check_persona(service.personas, speech.persona)  # the persona rule's first check
    words = await normalize_in_worker(speech.text) if speech.normalize else speech.text
    text = designed_text(control, words)
    with app[STATE_KEY].utterance():
        owner = client_owner(request.get(OWNER_KEY), request.protocol)
        priority = request_priority(request, speech.priority)
        # No lead bound: the reader wants the audio as fast as it comes (engine.policy, rule 5).
        options = UtteranceOptions(
            speech.persona, playback_speed=speech.speed, owner=owner, max_ahead_s=math.inf, priority=priority
        )
        job = SpeechJob(service.new_request_id("http"), text, speech.params, voice, options)
        outputs = service.speak(job)
        prompt = _PromptUsage()
        async with contextlib.aclosing(outputs), contextlib.aclosing(_noting_prompt(outputs, prompt)) as noted:
            return await _stream_speech(request, speech, noted, prompt)


@dataclass
class _PromptUsage:
    """The SSE ``usage``'s input count: the prompt positions the engine laid out, as its first chunk reports them."""

    positions: int = 0


async def _noting_prompt(outputs: AsyncGenerator[Chunk, None], usage: _PromptUsage) -> AsyncGenerator[Chunk, None]:
    """``outputs``, noting the prompt's positions as they pass (``Chunk.prompt_positions``)."""
    async for output in outputs:
        if output.prompt_positions is not None:
            usage.positions = output.prompt_positions
        yield output


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
    request: web.Request, speech: SpeechRequest, outputs: AsyncGenerator[Chunk, None], prompt: _PromptUsage
) -> web.StreamResponse:
    app = request.app
    service, config = app[SPEAKER_KEY], app[CONFIG_KEY]
    fmt, rate = OPENAI_RESPONSE_FORMATS[speech.response_format]
    opus = config.audio.opus_settings()
    encoder = make_encoder(
        fmt,
        service.info.sample_rate,
        output_rate=rate if speech.sample_rate is None else speech.sample_rate,
        bitrate=opus.bitrate,
        complexity=opus.complexity,
        speed=speech.speed,
    )
    headers = {IGNORED_FIELDS_HEADER: ignored_fields_header(speech.ignored)} if speech.ignored else {}
    if speech.whole:
        audio, _ = await whole_audio(request, outputs, encoder)
        return web.Response(body=audio, headers={**headers, hdrs.CONTENT_TYPE: encoder.content_type})
    headers[hdrs.CONTENT_TYPE] = "text/event-stream" if speech.sse else encoder.content_type
    frame = _sse_delta if speech.sse else bytes
    response, patches = await stream_audio(request, outputs, encoder, headers, frame)
    if speech.sse:
        await response.write(_sse_done(prompt.positions, patches))
    await response.write_eof()
    return response


def add_openai_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", create_speech)
    add_openai_voice_routes(app)
