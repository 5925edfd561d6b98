"""Request bodies as data: a ``RequestModel`` declares a body's fields once, and both the handlers' validation
(``RequestModel.check``, ``RequestModel.parse``) and the published schema (``RequestModel.json_schema``, in
``/openapi.json``) are made from it, so the document cannot say one thing while a handler does another.

A bound may be fixed here or read from the server's configuration (``--max-text-chars-per-utterance`` sets
``input``'s ``maxLength``), so each server publishes its own limits; so may what becomes of fields the model does
not have (``--strict-fields``). JSON ``null`` is the same as an absent field, as the OpenAI and Nano-vLLM APIs
treat it.

A body may name fields that have no effect: those the model does not know (``ExtraFields.LISTED``) and those it
declares ``ignored`` (other servers' fields, accepted so their clients work unchanged). ``RequestModel.ignored``
names them, for the response to say so.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from voxwire.audio.formats import OPENAI_RESPONSE_FORMATS, RESAMPLED_RATES
from voxwire.params import SynthesisParams
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import MAX_SEED, MAX_SPEED, MIN_SPEED, is_finite_number, is_unicode
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.http.priority import PRIORITY_CHOICES, PRIORITY_DESCRIPTION
from voxwire.serving.server_config import ServerConfig

Bound = int | float | Callable[[ServerConfig], int | float]
"""A numeric bound fixed here, or read from the server's configuration."""


class JsonType(str, enum.Enum):
    """A field's JSON type (its JSON Schema name); ``BINARY`` is a file part of a multipart form; an ``ARRAY``'s items
    are objects of the field's ``items``."""

    STRING = "string"
    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"
    BINARY = "binary"
    ARRAY = "array"


class ExtraFields(enum.Enum):
    """What a body's fields beyond the model's become."""

    REFUSED = "refused"
    """``unknown_field`` (the OpenAI API: a misspelt field is a client's mistake worth telling)."""
    IGNORED = "ignored"
    """Dropped silently (the Nano-vLLM API, as its FastAPI schemas do)."""
    LISTED = "listed"
    """Dropped, and named by ``RequestModel.ignored`` (clients of other OpenAI-compatible servers send fields of
    theirs; the response names them rather than refusing the request)."""


Extra = ExtraFields | Callable[[ServerConfig], ExtraFields]
"""What fields beyond a model's become: fixed here, or read from the server's configuration."""


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
    id_object: bool = False
    """A string field that also takes ``{"id": <string>}`` (the OpenAI SDK's voice object), read as that string."""
    ignored: bool = False
    """Accepted (checked as declared) and without effect: another server's field, named by ``RequestModel.ignored``."""
    items: Mapping[str, Field] | None = None
    """An ``ARRAY``'s items: objects of these fields (others in them are refused)."""
    max_items: int | None = None
    """Items an ``ARRAY`` holds at most."""


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
    if kind is JsonType.ARRAY:
        return isinstance(value, list)
    return isinstance(value, str) if kind is JsonType.STRING else False


@dataclass(frozen=True)
class RequestModel:
    """A JSON request body: its fields in the order they are checked, and what becomes of other fields."""

    name: str
    """The schema's name in the document's ``components``."""
    description: str
    fields: Mapping[str, Field]
    extra: Extra = ExtraFields.REFUSED
    form: bool = False
    """A ``multipart/form-data`` body, whose fields are its parts (text or ``BINARY``; never null)."""

    def check(self, body: object, config: ServerConfig) -> Checked:
        """``body`` (decoded JSON) against this model: every problem, each field's first."""
        if not isinstance(body, dict):
            message = "the body must be a JSON object"
            return Checked({}, [Problem(None, Rule.NOT_OBJECT, message, ErrorCode.INVALID_REQUEST)])
        problems: list[Problem] = []
        unknown = sorted(set(body) - set(self.fields))
        if unknown and self.extra_fields(config) is ExtraFields.REFUSED:
            message = f"unknown field(s) {unknown}; the fields are {sorted(self.fields)}"
            problems.append(Problem(None, Rule.UNKNOWN, message, ErrorCode.UNKNOWN_FIELD, unknown))
        values: dict[str, Any] = {}
        for name, spec in self.fields.items():
            value = body.get(name)
            problem = _check_missing(name, spec) if value is None else _check_value(name, spec, value, config)
            if problem is not None:
                problems.append(problem)
            elif value is not None:
                values[name] = value["id"] if spec.id_object and isinstance(value, dict) else value
        return Checked(values, problems)

    def extra_fields(self, config: ServerConfig) -> ExtraFields:
        """What this server makes of fields beyond the model's."""
        return self.extra(config) if callable(self.extra) else self.extra

    def ignored(self, body: object, config: ServerConfig) -> list[str]:
        """The fields of ``body`` (a valid one) that have no effect, sorted: the ``ignored`` ones it gives (not
        null), and those the model does not know where it lists them (``ExtraFields.LISTED``)."""
        if not isinstance(body, dict):
            return []
        named = [name for name, spec in self.fields.items() if spec.ignored and body.get(name) is not None]
        if self.extra_fields(config) is ExtraFields.LISTED:
            named += [name for name in body if name not in self.fields]
        return sorted(named)

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
        if self.extra_fields(config) is ExtraFields.REFUSED:
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
    if spec.id_object:
        by_id = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
        schema["anyOf"] = [{"type": schema.pop("type")}, by_id]
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
    if spec.items is not None:
        item = {name: field_schema(field, config, nullable=False) for name, field in spec.items.items()}
        required = [name for name, field in spec.items.items() if field.required]
        schema["items"] = {"type": "object", "properties": item, "required": required, "additionalProperties": False}
    if spec.max_items is not None:
        schema["maxItems"] = spec.max_items
    return schema


def _check_missing(name: str, spec: Field) -> Problem | None:
    if not spec.required:
        return None
    kind = "a non-empty string" if spec.non_blank else f"a {spec.type.value}"
    return Problem(name, Rule.MISSING, f"'{name}' is required: {kind}", spec.code)


def _check_value(name: str, spec: Field, value: object, config: ServerConfig) -> Problem | None:
    """The first rule of ``spec`` that ``value`` (not null) breaks, if any."""
    if spec.id_object and isinstance(value, dict):
        if not isinstance(value.get("id"), str):
            return Problem(name, Rule.TYPE, f"'{name}' as an object needs a string 'id'", spec.type_code)
        value = value["id"]
    if spec.type is JsonType.BINARY or not _has_type(value, spec.type):
        return Problem(name, Rule.TYPE, f"'{name}' has the wrong type ({_type_name(value)})", spec.type_code)
    hint = f"; {spec.hint}" if spec.hint else ""
    if isinstance(value, list):
        return _check_items(name, spec, value, config)
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


def _check_items(name: str, spec: Field, value: list[object], config: ServerConfig) -> Problem | None:
    """The first rule an ``ARRAY``'s items break: too many, not an object, a field unknown, missing or broken."""
    if spec.max_items is not None and len(value) > spec.max_items:
        message = f"'{name}' has {len(value)} items; at most {spec.max_items} are taken"
        return Problem(name, Rule.MAXIMUM, message, spec.code, spec.max_items)
    fields = spec.items or {}
    for index, item in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(item, dict):
            return Problem(name, Rule.TYPE, f"'{where}' must be an object", spec.type_code)
        unknown = sorted(set(item) - set(fields))
        if unknown:
            message = f"unknown field(s) {unknown} in '{where}'; the fields are {sorted(fields)}"
            return Problem(name, Rule.UNKNOWN, message, spec.type_code, unknown)
        for field, field_spec in fields.items():
            part = item.get(field)
            problem = (
                _check_missing(f"{where}.{field}", field_spec)
                if part is None
                else _check_value(f"{where}.{field}", field_spec, part, config)
            )
            if problem is not None:
                return problem
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

VLLM_OMNI_TASKS = ("Base", "CustomVoice", "VoiceDesign")
"""vLLM-Omni's ``task_type`` values (Qwen3-TTS): cloning from ``ref_audio``, a named speaker, voice design."""

_PRIORITY = Field(JsonType.STRING, PRIORITY_DESCRIPTION, choices=PRIORITY_CHOICES, code=ErrorCode.INVALID_PARAMETER)
"""A speech request's ``priority`` (``http/priority.py``); absent: the header's, else real-time."""


def _extra_speech_fields(config: ServerConfig) -> ExtraFields:
    return ExtraFields.REFUSED if config.limits.strict_fields else ExtraFields.LISTED


def _max_upload(config: ServerConfig) -> int:
    return config.voices.max_upload_bytes


def _max_inline_clip(config: ServerConfig) -> int:
    """Characters of a clip of ``max_upload_bytes`` as base64, with room for a data URI's header."""
    return 4 * math.ceil(config.voices.max_upload_bytes / 3) + DATA_URI_HEADER_CHARS


DATA_URI_HEADER_CHARS = 256
"""Room for ``data:<media type>;<parameters>;base64,`` in front of an inline clip."""


def _max_transcript(config: ServerConfig) -> int:
    return config.voices.max_transcript_chars


_LANGUAGE_TAG_CHARS = 64
"""Longer than any language tag or name a client sends (``en-US``, ``English``, ``a``)."""

_IGNORED = "Accepted and ignored (named in X-Voxwire-Ignored-Fields)"

SPEECH = RequestModel(
    "SpeechRequest",
    "OpenAI's speech request, with voxwire's extras (seed, cfg_value, inference_timesteps, normalize, persona) and "
    "the fields clients of other OpenAI-compatible servers send (Kokoro's stream and lang_code, vLLM-Omni's "
    "sample_rate, language, task_type, ref_audio and ref_text; fish-speech's references); other fields are ignored "
    "and named in the X-Voxwire-Ignored-Fields header, or refused (unknown_field) on a server run with "
    "--strict-fields.",
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
            JsonType.STRING,
            "A saved voice's id, or an OpenAI voice name (alloy, ...) for the model's default voice; also as the "
            'OpenAI SDK\'s voice object, {"id": ...}.',
            id_object=True,
        ),
        "response_format": Field(
            JsonType.STRING,
            "The audio's encoding; pcm is s16le at 24 kHz as OpenAI's, mulaw and alaw G.711 at 8 kHz, the others at "
            "the model's rate, unless sample_rate says otherwise.",
            choices=tuple(OPENAI_RESPONSE_FORMATS),
            default="mp3",
            code=ErrorCode.UNSUPPORTED_FORMAT,
        ),
        "sample_rate": Field(
            JsonType.INTEGER,
            "The audio's rate in Hz: any for pcm, wav and flac; 8000, 12000, 16000, 24000 or 48000 for opus; an MPEG "
            "rate for mp3 (8000 to 48000) and aac (7350 to 96000); 8000 for mulaw and alaw (400 invalid_parameter "
            "for a rate the format does not take).",
            minimum=min(RESAMPLED_RATES),
            maximum=max(RESAMPLED_RATES),
            code=ErrorCode.INVALID_PARAMETER,
            type_code=ErrorCode.INVALID_PARAMETER,
        ),
        "stream": Field(
            JsonType.BOOLEAN,
            "true: the audio streams as it is generated (a WAV's sizes unknown: 0xFFFFFFFF); false: the same audio "
            "as one whole file, sent once generated, with Content-Length and a WAV's or FLAC's real sizes.",
            default=True,
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
        "ref_audio": Field(
            JsonType.STRING,
            "A voice clip for this request (vLLM-Omni's per-request cloning): a base64 data URI "
            "(data:audio/wav;base64,...) or bare base64 of an audio file, at most the upload limit; a URL is refused "
            "(the server fetches nothing). Encoded once: the same clip again uses the encoded voice. Takes the place "
            "of voice.",
            max_length=_max_inline_clip,
            code=ErrorCode.INVALID_AUDIO,
            too_long_code=ErrorCode.UPLOAD_TOO_LARGE,
        ),
        "ref_text": Field(
            JsonType.STRING,
            "What ref_audio says: a continuation prompt (without it, a reference clip, where the model clones one).",
            max_length=_max_transcript,
            code=ErrorCode.TEXT_TOO_LONG,
        ),
        "references": Field(
            JsonType.ARRAY,
            "fish-speech's inline references: at most one {audio, text}, the same as ref_audio and ref_text (not "
            "with them).",
            items={
                "audio": Field(
                    JsonType.STRING,
                    "The clip, base64 (as ref_audio).",
                    required=True,
                    max_length=_max_inline_clip,
                    too_long_code=ErrorCode.UPLOAD_TOO_LARGE,
                ),
                "text": Field(
                    JsonType.STRING,
                    "What the clip says (as ref_text; empty: a reference clip).",
                    required=True,
                    max_length=_max_transcript,
                    too_long_code=ErrorCode.TEXT_TOO_LONG,
                ),
            },
            max_items=1,
        ),
        "language": Field(
            JsonType.STRING,
            f"{_IGNORED}: the model reads the language from the text.",
            max_length=_LANGUAGE_TAG_CHARS,
            ignored=True,
        ),
        "lang_code": Field(
            JsonType.STRING,
            f"Kokoro's language code. {_IGNORED}: the model reads the language from the text.",
            max_length=_LANGUAGE_TAG_CHARS,
            ignored=True,
        ),
        "user": Field(JsonType.STRING, f"OpenAI's end-user id. {_IGNORED}.", ignored=True),
        "task_type": Field(
            JsonType.STRING,
            f"vLLM-Omni's task. {_IGNORED}: the task follows from the other fields (ref_audio clones, instructions "
            "design, voice names a voice).",
            choices=VLLM_OMNI_TASKS,
            ignored=True,
        ),
    },
    _extra_speech_fields,
)


LORA = RequestModel(
    "LoraRequest",
    "A LoRA checkpoint folder inside --lora-root, loaded as a persona owned by the request's API key.",
    {
        "name": Field(JsonType.STRING, "The persona's name.", required=True),
        "path": Field(JsonType.STRING, "The folder, relative to --lora-root.", required=True),
    },
)


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

OPENAI_VOICE_TYPE = "audio_sample"
"""The one kind of voice ``POST /v1/audio/voices`` makes here (OpenAI's ``prompt`` voices are designed by a model we
do not serve)."""

OPENAI_VOICE_CREATE = RequestModel(
    "AudioVoiceCreate",
    "The OpenAI SDK's audio.voices.create (and vLLM-Omni's voice upload): a voice clip to encode once and save "
    "(multipart/form-data; each part at most once), as POST /v1/voices does.",
    {
        "audio_sample": VOICE_UPLOAD.fields["file"],  # the clip, as POST /v1/voices takes it
        "name": Field(
            JsonType.STRING,
            "A name for listings; no control or formatting characters.",
            required=True,
            max_length=_max_voice_name,
            code=ErrorCode.TEXT_TOO_LONG,
        ),
        "consent": Field(
            JsonType.STRING,
            "OpenAI's consent recording id: accepted and not checked (this server keeps no consent recordings).",
            max_length=_max_voice_name,
            code=ErrorCode.TEXT_TOO_LONG,
        ),
        "type": Field(
            JsonType.STRING,
            "How the voice is made: only audio_sample (400 unsupported for prompt).",
            choices=(OPENAI_VOICE_TYPE,),
            default=OPENAI_VOICE_TYPE,
            code=ErrorCode.UNSUPPORTED,
        ),
        "prompt": Field(
            JsonType.STRING,
            "OpenAI's description of a voice to design (type prompt): 400 unsupported.",
            max_length=_max_transcript,
            code=ErrorCode.UNSUPPORTED,
        ),
        "ref_text": Field(
            JsonType.STRING,
            "What the clip says (vLLM-Omni's name): makes a continuation prompt (empty: a reference clip).",
            max_length=_max_transcript,
            code=ErrorCode.TEXT_TOO_LONG,
        ),
        "speaker_description": Field(
            JsonType.STRING,
            "vLLM-Omni's description of the voice: accepted and not kept.",
            max_length=_max_voice_name,
            code=ErrorCode.TEXT_TOO_LONG,
        ),
    },
    form=True,
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

MODELS: tuple[RequestModel, ...] = (
    SPEECH,
    LORA,
    VOICE_UPLOAD,
    OPENAI_VOICE_CREATE,
    GENERATE,
    ENCODE_LATENTS,
    NANO_LORA,
)
"""Every request body the HTTP API reads, for the document's ``components``."""
