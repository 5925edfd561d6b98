"""The body and query of ElevenLabs' HTTP text-to-speech (``http/elevenlabs_tts.py``), as its API reference defines
them and its SDK sends them, declared once as ``RequestModel``s: the handler validates with them and
``/openapi.json`` publishes them.

Fields this server has no use for are accepted and ignored, as ElevenLabs' own API does with fields it does not
know (its SDK sends every field it has, ``pronunciation_dictionary_locators`` and ``audio_effects`` among them);
the ones the reference defines are listed, each saying what becomes of it. ``voice_settings.speed`` is the one
voice setting honoured: the tempo of the audio, pitch kept, as OpenAI's ``speed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from voxwire.audio.elevenlabs_formats import DEFAULT_OUTPUT_FORMAT, OutputFormat, parse_output_format
from voxwire.params import SynthesisParams
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import MAX_SPEED, MIN_SPEED
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.http.request_models import SPEECH, ExtraFields, Field, JsonType, RequestModel
from voxwire.serving.server_config import ServerConfig

IGNORED = "Accepted and ignored"


VOICE_SETTINGS = RequestModel(
    "ElevenLabsVoiceSettings",
    "ElevenLabs' voice settings: speed is honoured; the others are accepted and ignored (VoxCPM has no such controls).",
    {
        "speed": Field(
            JsonType.NUMBER,
            "Speaking speed; the tempo changes, the pitch is kept (as OpenAI's speed). ElevenLabs takes 0.7 to 1.2; "
            "this server the range of OpenAI's speed.",
            minimum=MIN_SPEED,
            maximum=MAX_SPEED,
            default=1.0,
            code=ErrorCode.INVALID_PARAMETER,
        ),
        "stability": Field(JsonType.NUMBER, f"{IGNORED}.", minimum=0.0, maximum=1.0, code=ErrorCode.INVALID_PARAMETER),
        "similarity_boost": Field(
            JsonType.NUMBER, f"{IGNORED}.", minimum=0.0, maximum=1.0, code=ErrorCode.INVALID_PARAMETER
        ),
        "style": Field(JsonType.NUMBER, f"{IGNORED}.", minimum=0.0, maximum=1.0, code=ErrorCode.INVALID_PARAMETER),
        "use_speaker_boost": Field(JsonType.BOOLEAN, f"{IGNORED}."),
    },
    ExtraFields.IGNORED,
)

TEXT_TO_SPEECH = RequestModel(
    "ElevenLabsSpeechRequest",
    "ElevenLabs' text-to-speech request. Fields beyond these are ignored, as ElevenLabs' clients send many.",
    {
        "text": SPEECH.fields["input"],  # the text to speak, bounded as OpenAI's input is
        "model_id": Field(JsonType.STRING, "Any name: the server speaks with the one model it serves."),
        "seed": SPEECH.fields["seed"],
        "language_code": Field(JsonType.STRING, f"{IGNORED}: the model reads the language from the text."),
        "previous_text": Field(
            JsonType.STRING,
            f"{IGNORED}: continuing a voice needs the earlier text's audio, which this request does not carry.",
        ),
        "next_text": Field(JsonType.STRING, f"{IGNORED}."),
        "apply_text_normalization": Field(
            JsonType.STRING, f"{IGNORED}.", choices=("auto", "on", "off"), code=ErrorCode.INVALID_PARAMETER
        ),
        # This server's per-request cloning, as on /v1/audio/speech (vLLM-Omni's names): the clip in place of the
        # path's voice.
        "ref_audio": SPEECH.fields["ref_audio"],
        "ref_text": SPEECH.fields["ref_text"],
    },
    ExtraFields.IGNORED,
)

MODELS = (TEXT_TO_SPEECH, VOICE_SETTINGS)
"""The bodies of ElevenLabs' routes, for the document's ``components``."""


def json_schemas(config: ServerConfig) -> dict[str, dict[str, Any]]:
    """``MODELS``' schemas for ``/openapi.json``; ``voice_settings`` (an object, which ``Field`` does not describe)
    refers to its own."""
    body = TEXT_TO_SPEECH.json_schema(config)
    settings = {"$ref": f"#/components/schemas/{VOICE_SETTINGS.name}"}
    body["properties"]["voice_settings"] = {"anyOf": [settings, {"type": "null"}]}
    return {TEXT_TO_SPEECH.name: body, VOICE_SETTINGS.name: VOICE_SETTINGS.json_schema(config)}


STREAMING_LATENCY_LEVELS = ("0", "1", "2", "3", "4")
"""``optimize_streaming_latency``'s values (accepted and ignored: this server streams as soon as it can)."""


@dataclass(frozen=True)
class ElevenLabsSpeech:
    """A validated ElevenLabs text-to-speech request."""

    text: str
    output: OutputFormat
    params: SynthesisParams
    speed: float = 1.0
    """``voice_settings.speed``."""
    ref_audio: str | None = None
    """A voice clip for this request (``inline_clip``), in place of the path's voice."""
    ref_text: str | None = None
    """What ``ref_audio`` says."""


def parse_query(query: Mapping[str, str]) -> OutputFormat:
    """The ``output_format`` asked for (ElevenLabs' default mp3 without one); ``optimize_streaming_latency`` and
    ``enable_logging`` are checked and ignored. Raises ``ApiError`` 400."""
    try:
        output = parse_output_format(query.get("output_format", DEFAULT_OUTPUT_FORMAT))
    except ValueError as exc:
        raise ApiError(ErrorCode.UNSUPPORTED_FORMAT, str(exc)) from None
    latency = query.get("optimize_streaming_latency")
    if latency is not None and latency not in STREAMING_LATENCY_LEVELS:
        levels = ", ".join(STREAMING_LATENCY_LEVELS)
        raise ApiError(ErrorCode.INVALID_PARAMETER, f"optimize_streaming_latency is {latency!r}; use one of {levels}")
    logging = query.get("enable_logging")
    if logging is not None and logging not in ("true", "false"):
        raise ApiError(ErrorCode.INVALID_PARAMETER, f"enable_logging is {logging!r}; use true or false")
    return output


def parse_body(body: object, output: OutputFormat, config: ServerConfig) -> ElevenLabsSpeech:
    """Validate a body against ``TEXT_TO_SPEECH`` (and its ``voice_settings`` against ``VOICE_SETTINGS``); every
    refusal names the field."""
    given = TEXT_TO_SPEECH.parse(body, config)
    assert isinstance(body, dict), "parse refuses a body that is not an object"
    settings = body.get("voice_settings")
    if settings is not None and not isinstance(settings, dict):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'voice_settings' must be an object, not {type(settings).__name__}")
    voice = {**VOICE_SETTINGS.defaults(), **VOICE_SETTINGS.parse(settings or {}, config)}
    params = SynthesisParams(seed=given["seed"]) if "seed" in given else SynthesisParams()
    return ElevenLabsSpeech(
        given["text"], output, params, speed=float(voice["speed"]), ref_audio=given.get("ref_audio"),
        ref_text=given.get("ref_text"),
    )  # fmt: skip
