"""Request bodies as data: a ``RequestModel`` declares a body's fields once, and both the handlers' validation
(``RequestModel.check``, ``RequestModel.parse``) and the published schema (``RequestModel.json_schema``, in
``/openapi.json``) are made from it, so the document cannot say one thing while a handler does another.

A bound may be fixed here or read from the server's configuration (``--max-text-chars-per-utterance`` sets
``input``'s ``maxLength``), so each server publishes its own limits. JSON ``null`` is the same as an absent
field, as the OpenAI and Nano-vLLM APIs treat it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from voxwire.audio.formats import OPENAI_RESPONSE_FORMATS
from voxwire.params import SynthesisParams
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import MAX_SEED, MAX_SPEED, MIN_SPEED, is_finite_number, is_unicode
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.http.priority import PRIORITY_CHOICES, PRIORITY_DESCRIPTION
from voxwire.serving.server_config import ServerConfig

Bound = int | float | Callable[[ServerConfig], int | float]
"""A numeric bound fixed here, or read from the server's configuration."""


class JsonType(str, enum.Enum):
    """A field's JSON type (its JSON Schema name); ``BINARY`` is a file part of a multipart form."""

    STRING = "string"
    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"
    BINARY = "binary"


class ExtraFields(enum.Enum):
    """What a body's fields beyond the model's become."""

    REFUSED = "refused"
    """``unknown_field`` (the OpenAI API: a misspelt field is a client's mistake worth telling)."""
    IGNORED = "ignored"
    """Dropped silently (the Nano-vLLM API, as its FastAPI schemas do)."""


class Rule(enum.Enum):
    """The rule a refused body broke."""

    NOT_OBJECT = "not_object"
    UNKNOWN = "unknown"
    MISSING = "missing"
    TYPE = "type"
    NOT_FINITE = "not_finite"
    MINIMUM = "minimum"
    MAXIMUM = "maximum"
    CHOICE = "choice"
    BLANK = "blank"
    TOO_LONG = "too_long"


@dataclass(frozen=True)
class Field:
    """One field of a body: its type, bounds and the error code of a value it refuses."""

    type: JsonType
    description: str
    required: bool = False
    choices: tuple[str, ...] = ()
    minimum: Bound | None = None
    maximum: Bound | None = None
    max_length: Bound | None = None
    """Characters of a string (a text form part's too); bytes of a ``BINARY`` part."""
    non_blank: bool = False
    """A string with something besides whitespace."""
    default: object = None
    """What an absent field means: published, and given by ``RequestModel.defaults``."""
    code: ErrorCode = ErrorCode.INVALID_REQUEST
    """The code of a value this field refuses: missing, blank, too long, out of bounds, not one of ``choices``."""
    type_code: ErrorCode = ErrorCode.INVALID_REQUEST
    """The code of a value of the wrong JSON type."""
    too_long_code: ErrorCode | None = None
    """The code of a string over ``max_length``, where it is not ``code``."""
    hint: str = ""
    """Said after the refusal of a value (why the rule is there)."""


@dataclass(frozen=True)
class Problem:
    """One way a body breaks its model: the field (None for the body itself), the rule, a message naming the
    field, its error code, and the bound broken (for ``MINIMUM``, ``MAXIMUM``, ``CHOICE`` and ``TOO_LONG``)."""

    field: str | None
    rule: Rule
    message: str
    code: ErrorCode
    bound: object = None


@dataclass(frozen=True)
class Checked:
    """A body checked against its model: the values of the fields it gave (nulls left out) and its problems."""

    values: dict[str, Any]
    problems: list[Problem]


def resolve(bound: Bound, config: ServerConfig) -> int | float:
    return bound(config) if callable(bound) else bound


def _type_name(value: object) -> str:
    return type(value).__name__


def _has_type(value: object, kind: JsonType) -> bool:
    if isinstance(value, bool):
        return kind is JsonType.BOOLEAN
    if kind is JsonType.INTEGER:
        return isinstance(value, int)
    if kind is JsonType.NUMBER:
        return isinstance(value, (int, float))
    return isinstance(value, str) if kind is JsonType.STRING else False


@dataclass(frozen=True)
class RequestModel:
    """A JSON request body: its fields in the order they are checked, and what becomes of other fields."""

    name: str
    """The schema's name in the document's ``components``."""
    description: str
    fields: Mapping[str, Field]
    extra: ExtraFields = ExtraFields.REFUSED
    form: bool = False
    """A ``multipart/form-data`` body, whose fields are its parts (text or ``BINARY``; never null)."""

    def check(self, body: object, config: ServerConfig) -> Checked:
        """``body`` (decoded JSON) against this model: every problem, each field's first."""
        if not isinstance(body, dict):
            message = "the body must be a JSON object"
            return Checked({}, [Problem(None, Rule.NOT_OBJECT, message, ErrorCode.INVALID_REQUEST)])
        problems: list[Problem] = []
        unknown = sorted(set(body) - set(self.fields))
        if unknown and self.extra is ExtraFields.REFUSED:
            message = f"unknown field(s) {unknown}; the fields are {sorted(self.fields)}"
            problems.append(Problem(None, Rule.UNKNOWN, message, ErrorCode.UNKNOWN_FIELD, unknown))
        values: dict[str, Any] = {}
        for name, spec in self.fields.items():
            value = body.get(name)
            problem = _check_missing(name, spec) if value is None else _check_value(name, spec, value, config)
            if problem is not None:
                problems.append(problem)
            elif value is not None:
                values[name] = value
        return Checked(values, problems)

    def parse(self, body: object, config: ServerConfig) -> dict[str, Any]:
        """The values of ``body``'s fields; ``ApiError`` with the first problem's code if it has any."""
        checked = self.check(body, config)
        if checked.problems:
            first = checked.problems[0]
            raise ApiError(first.code, first.message)
        return checked.values

    def parse_field(self, name: str, value: Any, config: ServerConfig) -> Any:
        """One field's value (not null), as ``parse`` takes it; ``ApiError`` if it breaks a rule."""
        problem = _check_value(name, self.fields[name], value, config)
        if problem is not None:
            raise ApiError(problem.code, problem.message)
        return value

    def defaults(self) -> dict[str, Any]:
        """The value of each field that has a default."""
        return {name: spec.default for name, spec in self.fields.items() if spec.default is not None}

    def json_schema(self, config: ServerConfig) -> dict[str, Any]:
        """The body's JSON Schema (OpenAPI 3.1), with this server's bounds; a form's is its parts'."""
        schema: dict[str, Any] = {
            "type": "object",
            "description": self.description,
            "properties": {
                name: field_schema(spec, config, nullable=not self.form) for name, spec in self.fields.items()
            },
        }
        required = [name for name, spec in self.fields.items() if spec.required]
        if required:
            schema["required"] = required
        if self.extra is ExtraFields.REFUSED:
            schema["additionalProperties"] = False
        return schema


def field_schema(spec: Field, config: ServerConfig, *, nullable: bool = True) -> dict[str, Any]:
    """One field's JSON Schema; with ``nullable``, an optional field may also be ``null`` (the same as absent)."""
    schema: dict[str, Any] = {"description": spec.description + (f" ({spec.hint})" if spec.hint else "")}
    if spec.type is JsonType.BINARY:
        schema.update(type="string", contentMediaType="application/octet-stream")
        if spec.max_length is not None:
            schema["description"] += f"; at most {resolve(spec.max_length, config)} bytes"
        return schema
    null = nullable and not spec.required
    schema["type"] = [spec.type.value, "null"] if null else spec.type.value
    if spec.choices:
        schema["enum"] = [*spec.choices, *((None,) if null else ())]
    if spec.minimum is not None:
        schema["minimum"] = resolve(spec.minimum, config)
    if spec.maximum is not None:
        schema["maximum"] = resolve(spec.maximum, config)
    if spec.max_length is not None:
        schema["maxLength"] = resolve(spec.max_length, config)
    if spec.non_blank:
        schema["minLength"] = 1
        schema["pattern"] = r"\S"
    if spec.default is not None:
        schema["default"] = spec.default
    return schema


def _check_missing(name: str, spec: Field) -> Problem | None:
    if not spec.required:
        return None
    kind = "a non-empty string" if spec.non_blank else f"a {spec.type.value}"
    return Problem(name, Rule.MISSING, f"'{name}' is required: {kind}", spec.code)


def _check_value(name: str, spec: Field, value: object, config: ServerConfig) -> Problem | None:
    """The first rule of ``spec`` that ``value`` (not null) breaks, if any."""
    if spec.type is JsonType.BINARY or not _has_type(value, spec.type):
        return Problem(name, Rule.TYPE, f"'{name}' has the wrong type ({_type_name(value)})", spec.type_code)
    hint = f"; {spec.hint}" if spec.hint else ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not is_finite_number(value):  # 1e400 parses as inf, 10**400 as an int no float holds
            return Problem(name, Rule.NOT_FINITE, f"'{name}' must be a finite number", spec.code)
        if spec.minimum is not None and value < (low := resolve(spec.minimum, config)):
            return Problem(name, Rule.MINIMUM, f"'{name}'={value:g} is below {low:g}{hint}", spec.code, low)
        if spec.maximum is not None and value > (high := resolve(spec.maximum, config)):
            return Problem(name, Rule.MAXIMUM, f"'{name}'={value:g} is above {high:g}{hint}", spec.code, high)
    if isinstance(value, str):
        if not is_unicode(value):  # a lone surrogate (JSON's "\\ud800"): no tokenizer, log or header takes it
            return Problem(name, Rule.TYPE, f"'{name}' is not valid Unicode (a lone surrogate)", spec.type_code)
        if spec.choices and value not in spec.choices:
            message = f"'{name}' is {value!r}; use one of {', '.join(spec.choices)}{hint}"
            return Problem(name, Rule.CHOICE, message, spec.code, list(spec.choices))
        if spec.non_blank and not value.strip():
            return Problem(name, Rule.BLANK, f"'{name}' must be a non-empty string", spec.code)
        if spec.max_length is not None and len(value) > (limit := resolve(spec.max_length, config)):
            message = f"'{name}' has {len(value)} characters; the limit is {limit}{hint}"
            return Problem(name, Rule.TOO_LONG, message, spec.too_long_code or spec.code, limit)
    return None


# ---- the models ---------------------------------------------------------------------------------


def _max_text(config: ServerConfig) -> int:
    return config.limits.max_text_chars_per_utterance


def _max_message_text(config: ServerConfig) -> int:
    return config.limits.max_text_chars_per_message


def _min_cfg(config: ServerConfig) -> float:
    return config.engine.engine_config().limits.min_cfg_value


def _max_cfg(config: ServerConfig) -> float:
    return config.engine.engine_config().limits.max_cfg_value


def _max_timesteps(config: ServerConfig) -> int:
    return config.engine.engine_config().limits.max_inference_timesteps


_ENGINE_DEFAULTS = SynthesisParams()
"""What an utterance gets for the settings a request leaves out."""

_PRIORITY = Field(JsonType.STRING, PRIORITY_DESCRIPTION, choices=PRIORITY_CHOICES, code=ErrorCode.INVALID_PARAMETER)
"""A speech request's ``priority`` (``http/priority.py``); absent: the header's, else real-time."""

SPEECH = RequestModel(
    "SpeechRequest",
    "OpenAI's speech request, with voxwire's extras (seed, cfg_value, inference_timesteps, normalize, persona).",
    {
        "model": Field(JsonType.STRING, "Any name: the server speaks with the one model it serves."),
        "input": Field(
            JsonType.STRING,
            "The text to speak.",
            required=True,
            non_blank=True,
            max_length=_max_text,
            code=ErrorCode.EMPTY_INPUT,
            too_long_code=ErrorCode.TEXT_TOO_LONG,
        ),
        "voice": Field(
            JsonType.STRING, "A saved voice's id, or an OpenAI voice name (alloy, ...) for the model's default voice."
        ),
        "response_format": Field(
            JsonType.STRING,
            "The audio's encoding; pcm is 24 kHz s16le, as OpenAI's.",
            choices=tuple(OPENAI_RESPONSE_FORMATS),
            default="mp3",
            code=ErrorCode.UNSUPPORTED_FORMAT,
        ),
        "speed": Field(
            JsonType.NUMBER,
            "Speaking speed; the tempo changes, the pitch is kept.",
            minimum=MIN_SPEED,
            maximum=MAX_SPEED,
            default=1.0,
            code=ErrorCode.INVALID_PARAMETER,
        ),
        "instructions": Field(
            JsonType.STRING,
            "Voice direction: VoxCPM2's voice design (400 unsupported where the model or the voice has none).",
            max_length=_max_message_text,
            too_long_code=ErrorCode.TEXT_TOO_LONG,
        ),
        "stream_format": Field(
            JsonType.STRING,
            "audio: the encoded audio as a chunked body; sse: speech.audio.delta events, then speech.audio.done.",
            choices=("audio", "sse"),
            default="audio",
            code=ErrorCode.UNSUPPORTED_STREAM_FORMAT,
        ),
        "seed": Field(
            JsonType.INTEGER,
            "Noise seed, for reproducible audio.",
            minimum=0,
            maximum=MAX_SEED - 1,
            code=ErrorCode.INVALID_PARAMETER,
            type_code=ErrorCode.INVALID_PARAMETER,
        ),
        "cfg_value": Field(
            JsonType.NUMBER,
            "Classifier-free guidance scale of the diffusion.",
            minimum=_min_cfg,
            maximum=_max_cfg,
            default=_ENGINE_DEFAULTS.cfg_value,
            code=ErrorCode.INVALID_PARAMETER,
            type_code=ErrorCode.INVALID_PARAMETER,
        ),
        "inference_timesteps": Field(
            JsonType.INTEGER,
            "Diffusion steps per patch.",
            minimum=1,
            maximum=_max_timesteps,
            default=_ENGINE_DEFAULTS.inference_timesteps,
            code=ErrorCode.INVALID_PARAMETER,
            type_code=ErrorCode.INVALID_PARAMETER,
        ),
        "normalize": Field(
            JsonType.BOOLEAN,
            "Read numbers, dates and money as words first (needs voxwire[normalize]: 400 normalize_unavailable).",
            default=False,
        ),
        "persona": Field(JsonType.STRING, "A LoRA persona loaded on this server (404 unknown_persona otherwise)."),
        "priority": _PRIORITY,
    },
)


LORA = RequestModel(
    "LoraRequest",
    "A LoRA checkpoint folder inside --lora-root, loaded as a persona owned by the request's API key.",
    {
        "name": Field(JsonType.STRING, "The persona's name.", required=True),
        "path": Field(JsonType.STRING, "The folder, relative to --lora-root.", required=True),
    },
)


def _max_upload(config: ServerConfig) -> int:
    return config.voices.max_upload_bytes


def _max_transcript(config: ServerConfig) -> int:
    return config.voices.max_transcript_chars


def _max_voice_name(config: ServerConfig) -> int:
    return config.voices.max_voice_name_chars


VOICE_UPLOAD = RequestModel(
    "VoiceUpload",
    "A voice clip to encode once and save (multipart/form-data; each part at most once).",
    {
        "file": Field(
            JsonType.BINARY,
            "The clip: any format soundfile reads, any rate.",
            required=True,
            max_length=_max_upload,
            code=ErrorCode.UPLOAD_TOO_LARGE,
        ),
        "transcript": Field(
            JsonType.STRING,
            "What the clip says: makes a continuation prompt (empty: a reference clip, where the model clones one).",
            max_length=_max_transcript,
            code=ErrorCode.TEXT_TOO_LONG,
        ),
        "name": Field(
            JsonType.STRING,
            "A name for listings; no control or formatting characters.",
            max_length=_max_voice_name,
            code=ErrorCode.TEXT_TOO_LONG,
        ),
    },
)


# Nano-vLLM-VoxCPM's bodies: unknown fields are ignored, as its FastAPI schemas do.

_NANO_TEXT = "What to say."
GENERATE = RequestModel(
    "GenerateRequest",
    "Nano-vLLM-VoxCPM's generate request: one prompt form (wav or latents, each with prompt_text) or none "
    "(zero-shot), and at most one reference form.",
    {
        "target_text": Field(JsonType.STRING, _NANO_TEXT, required=True, non_blank=True, max_length=_max_text),
        "prompt_wav_base64": Field(JsonType.STRING, "A prompt clip (an audio file), base64."),
        "prompt_wav_format": Field(JsonType.STRING, "The prompt clip's format (e.g. wav)."),
        "prompt_latents_base64": Field(JsonType.STRING, "Prompt latents from /encode_latents."),
        "prompt_text": Field(JsonType.STRING, "What the prompt says; with a prompt only."),
        "ref_audio_wav_base64": Field(JsonType.STRING, "A reference clip (an audio file), base64."),
        "ref_audio_wav_format": Field(JsonType.STRING, "The reference clip's format."),
        "ref_audio_latents_base64": Field(JsonType.STRING, "Reference latents from /encode_latents."),
        "lora_name": Field(JsonType.STRING, "A registered LoRA (400 otherwise)."),
        "max_generate_length": Field(JsonType.INTEGER, "At most this many patches.", minimum=1, default=2000),
        "temperature": Field(
            JsonType.NUMBER, "Diffusion noise scale.", minimum=0.0, default=1.0, hint="only 1.0 is served (400)"
        ),
        "cfg_value": Field(
            JsonType.NUMBER,
            "Classifier-free guidance scale.",
            minimum=0.0,
            default=1.5,
            hint="at most the server's limit (400)",
        ),
        "seed": Field(JsonType.INTEGER, "Noise seed.", hint="0 to 2**63 - 1 (400)"),
        "response_format": Field(
            JsonType.STRING, "mp3, or pcm (s16le at the model's rate).", choices=("mp3", "pcm"), default="mp3"
        ),
        "priority": _PRIORITY,
    },
    ExtraFields.IGNORED,
)
ENCODE_LATENTS = RequestModel(
    "EncodeLatentsRequest",
    "An audio file to encode as prompt latents.",
    {
        "wav_base64": Field(JsonType.STRING, "The audio file, base64.", required=True),
        "wav_format": Field(JsonType.STRING, "Its format (e.g. wav).", required=True),
    },
    ExtraFields.IGNORED,
)
NANO_LORA = RequestModel(
    "NanoLoraRequest",
    "A LoRA folder inside --lora-root to register under a name.",
    {
        "name": Field(JsonType.STRING, "The LoRA's name.", required=True),
        "path": Field(JsonType.STRING, "The folder, relative to --lora-root.", required=True),
    },
    ExtraFields.IGNORED,
)

MODELS: tuple[RequestModel, ...] = (SPEECH, LORA, VOICE_UPLOAD, GENERATE, ENCODE_LATENTS, NANO_LORA)
"""Every request body the HTTP API reads, for the document's ``components``."""
