"""OpenAI's ``POST /v1/audio/speech``: parse, admit, speak, and stream the audio as a body or as SSE events.

``instructions`` and the voice name design the voice on VoxCPM2 (``serving/speech/voice_design.py``; the whole input
is one request, the designed text the reference's ``(control)text``); ``speed`` changes the tempo of the encoded
audio, pitch kept (``audio/tempo.py``).

Handlers are thin: they parse (``parse_speech``), hand the work to the ``Speaker``, and stream the result
(``stream.stream_audio``); nothing here touches the model. A speech request refused before it starts
(``not_ready``, ``shutting_down``, ``busy``) has ``Retry-After`` (a balancer may retry it elsewhere, see
``admission``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from aiohttp import hdrs, web

from voxwire.audio.formats import OPENAI_RESPONSE_FORMATS, make_encoder
from voxwire.engine import Chunk, Priority, SynthesisParams
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.admission import require_admission
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.http.body import read_json
from voxwire.serving.http.priority import request_priority
from voxwire.serving.http.request_models import SPEECH
from voxwire.serving.http.stream import stream_audio
from voxwire.serving.runtime.keys import (
    CONFIG_KEY,
    OWNER_KEY,
    SPEAKER_KEY,
    STATE_KEY,
    VOICES_KEY,
)
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


def parse_speech(body: object, config: ServerConfig) -> SpeechRequest:
    """Validate an OpenAI speech request against ``request_models.SPEECH`` (the schema ``/openapi.json``
    publishes); every refusal names the field and has its own code."""
    given = SPEECH.parse(body, config)
    fields = {**SPEECH.defaults(), **given}
    normalize = fields["normalize"]
    if normalize and not normalizer_available():
        raise ApiError(ErrorCode.NORMALIZE_UNAVAILABLE, f"'normalize' is not available on this server: {EXTRA_HINT}")
    # Within this server's limits (the model checks them, as a WebSocket start's are checked).
    params = SynthesisParams(
        **{name: given[name] for name in ("seed", "cfg_value", "inference_timesteps") if name in given}
    )
    return SpeechRequest(
        fields["input"], fields.get("voice"), fields["response_format"], params, sse=fields["stream_format"] == "sse",
        normalize=normalize, persona=fields.get("persona"), instructions=fields.get("instructions"),
        speed=float(fields["speed"]), priority=None if "priority" not in given else Priority(given["priority"]),
    )  # fmt: skip


async def create_speech(request: web.Request) -> web.StreamResponse:
    """OpenAI's ``POST /v1/audio/speech``: the audio streams as a chunked body while it is generated."""
    app = request.app
    require_admission(app, connection=False)
    body = await read_json(request, app[CONFIG_KEY].limits.body_timeout_s)
    speech = parse_speech(body, app[CONFIG_KEY])
    voice = app[VOICES_KEY].resolve(speech.voice)
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
        output_rate=rate,
        bitrate=opus.bitrate,
        complexity=opus.complexity,
        speed=speech.speed,
    )
    content_type = "text/event-stream" if speech.sse else encoder.content_type
    frame = _sse_delta if speech.sse else bytes
    response, patches = await stream_audio(request, outputs, encoder, {hdrs.CONTENT_TYPE: content_type}, frame)
    if speech.sse:
        await response.write(_sse_done(prompt.positions, patches))
    await response.write_eof()
    return response


def add_openai_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", create_speech)
