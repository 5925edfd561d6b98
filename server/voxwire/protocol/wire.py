"""The WebSocket wire protocol of ``/v1/tts/stream``, sans I/O: every message as a value with encode/decode.

The normative specification is ``docs/protocol.md``; this module implements it.

This module is the only place that knows the bytes on the wire (no sockets, no asyncio, no audio
code, stdlib only); the session logic and any Python client speak in these dataclasses, and
``tests/fixtures/protocol_vectors.json`` pins the encoding for the clients of other languages.

Control messages are JSON objects in text frames, discriminated by ``"type"``. Client to server:
``start`` (settings for the utterances that follow; every field optional), ``text``, ``flush``,
``end``, ``cancel``, ``close_context``. Server to client: ``ready``, ``segment``, ``done``, ``error``,
and ``audio`` (a frame as JSON, with ``start.audio_transport`` ``json``). A client message with an
unknown field, a value of the wrong JSON type, or a value out of range is refused as a whole with a
typed ``ProtocolError`` whose ``code`` is stable (``ErrorCode``). Every message may name a
``context_id`` (one of several independent streams on the connection; none: the default context).
Client messages omit unset optional fields; server messages always carry every field (``null`` when
unknown) except ``context_id``, which is left out for the default context so that a client that names
no context sees the messages it always did.

Audio travels in binary frames, server to client only. Layout (all integers little-endian)::

    offset  size  field
    0       1     version      FRAME_VERSION (1)
    1       1     format       0 opus, 1 ogg_opus, 2 pcm_s16le, 3 pcm_f32le, 4 pcm_mulaw, 5 pcm_alaw (FRAME_FORMATS)
    2       2     header_size  bytes before the payload (12 without extensions; skip it, do not assume it)
    4       4     utterance    the utterance number (0, 1, 2, ... per connection, all contexts together)
    8       4     sequence     this frame's number within its utterance (0, 1, 2, ...)
    12      ...   extensions   [tag u8][length u8][value] fields up to header_size; tag 0 is padding and ends
                               them, tag 1 is the context id (UTF-8), unknown tags are skipped
    header_size   payload

Frames of the default context have no extension (the 12-byte header); the context field is padded
with zeros to a multiple of 4, so the payload stays 4-byte aligned (``new Float32Array(buf, header_size)``).
For ``opus`` the payload is one or more raw Opus packets (RFC 6716, one 20 ms frame each), each
preceded by its length as a u16: ``[len][packet][len][packet]...``; feed each packet to a WebCodecs
``AudioDecoder`` as one chunk. For the other formats the payload is the format's bytes (Ogg pages,
or little-endian mono samples) and frames may be concatenated as they come. A client drops the
frames of an utterance it cancelled by their ``utterance`` number.
"""

from __future__ import annotations

import base64
import enum
import json
import math
import struct
import typing
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

from voxwire.protocol.error_codes import ErrorCode as ErrorCode  # re-exported: a ProtocolError's code


def is_finite_number(value: object) -> bool:
    """An int or float (not bool) that is finite as a float: JSON gives 10**400 as an int no float can hold.
    The one rule for a number a client sends; the engine's parameters and LoRA configs use it too."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


STREAM_PATH = "/v1/tts/stream"
"""The WebSocket streaming endpoint."""

PROTOCOL_VERSION = 1
"""Announced in ``ready``; bumped when a message changes incompatibly."""

FRAME_VERSION = 1
FRAME_FORMATS = ("opus", "ogg_opus", "pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw")
"""The audio formats a WebSocket session can stream; a frame's format byte is the index here."""
PCM_FORMATS = ("pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw")
"""The formats whose rate a client chooses (``start.sample_rate``): raw samples, resampled on the server."""
SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
"""The rates ``start.sample_rate`` may ask for (telephony, wideband, and the usual media rates)."""
AUDIO_TRANSPORTS = ("binary", "json")
"""How audio reaches the client (``start.audio_transport``): binary frames, or base64 in ``audio`` text frames."""
MAX_CONTEXT_ID_BYTES = 64
"""Longest ``context_id`` in UTF-8 bytes: it is repeated in every message and frame header of its context."""

_FRAME_HEADER = struct.Struct("<BBHII")
_PACKET_LENGTH = struct.Struct("<H")
_EXTENSION = struct.Struct("<BB")
"""A header extension field: tag, length; the value follows. Tag 0 is padding and ends the fields."""
_CONTEXT_TAG = 1
"""The header extension that names a frame's context (its ``context_id`` in UTF-8)."""
_PADDING_TAG = 0
MAX_PACKET_BYTES = 0xFFFF
"""Largest Opus packet a u16 length prefix can carry (libopus packets are at most 1275 bytes)."""

MAX_SEED = 2**63
"""Seeds are ints in [0, MAX_SEED), an int64's non-negative range. The one bound on a seed: ``Start.check`` (a
``start`` message) and ``SynthesisParams`` (every request, whatever its transport) check it, and a segment's
seed (``seed + k``) wraps modulo it."""
MAX_BUFFER_DELAY_MS = 60_000
"""Longest wait for more text a client may ask for; a minute covers any language model's pause."""
MAX_PLAYBACK_LEAD_MS = 10_000
"""Bound on ``start.playback_lead_ms``: a listener buffering more than this is not listening live."""
MIN_SPEED = 0.25
"""Slowest ``start.speed`` (and HTTP ``speed``): OpenAI's range, 0.25 to 4.0."""
MAX_SPEED = 4.0
"""Fastest ``start.speed`` (and HTTP ``speed``)."""


class CloseCode(enum.IntEnum):
    """WebSocket close codes the server uses; the close reason starts with the ``ErrorCode`` value."""

    NORMAL = 1000
    GOING_AWAY = 1001
    """The server is shutting down."""
    PROTOCOL_ERROR = 1002
    """A frame that breaks RFC 6455, e.g. an unmasked client frame (``protocol_error``)."""
    INVALID_DATA = 1007
    """A text frame that is not UTF-8 (``invalid_json``; RFC 6455 requires closing)."""
    POLICY_VIOLATION = 1008
    """Sent only to an ElevenLabs socket whose key, due in its first message, did not come or is not valid
    (``unauthorized``): the close code ElevenLabs uses for it."""
    MESSAGE_TOO_BIG = 1009
    """A message far over ``max_message_bytes`` (refused before it is read; smaller excesses get an error)."""
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013
    """Sent only where HTTP 503 could not be: to an ElevenLabs socket upgraded without a key whose key, in its first
    message, finds the server full (it refuses other new connections with 503); clients retry it like a 503."""
    SLOW_CONSUMER = 4001
    """The client did not read audio fast enough; more than ``max_unsent_audio_s`` was waiting."""
    IDLE_TIMEOUT = 4002
    """No client message and nothing spoken for ``idle_timeout_s``."""
    RATE_LIMITED = 4003
    """More than ``max_messages_per_s`` client messages a second, beyond a one-second burst."""


class ProtocolError(Exception):
    """A message that cannot be accepted; ``code`` is stable, the text is for humans."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---- JSON messages ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Settings for the utterances that follow; an omitted field takes the server's default.

    Accepted between utterances (not while one has text and no ``end``); answered with ``ready``.
    """

    type: ClassVar[str] = "start"
    voice: str | None = None
    """A saved voice id, ``default`` or an OpenAI voice name (a designed voice on VoxCPM2, else the default one)."""
    format: str | None = None
    """One of ``FRAME_FORMATS``; the server default is ``opus``."""
    seed: int | None = None
    """Segment k of each utterance uses ``seed + k``; omitted means a fresh random seed per segment."""
    cfg_value: float | None = None
    inference_timesteps: int | None = None
    max_buffer_delay_ms: int | None = None
    """How long an incomplete sentence waits for more text before it is spoken; 0 speaks each text at once."""
    normalize: bool | None = None
    """Read numbers, dates and money as words (``voxwire[normalize]``), per sentence; default off."""
    playback_lead_ms: int | None = None
    """Audio the client buffers before it starts playing an utterance; the server's real-time scheduler
    keeps each stream ahead of the playback this implies (default: the server's ``--playback-lead-ms``)."""
    max_ahead_ms: int | None = None
    """How far ahead of the playback the server may generate (the audio the client must be able to buffer);
    default: the server's ``--max-ahead-ms``, at most its ``--max-ahead-limit-ms``."""
    persona: str | None = None
    """A LoRA persona loaded on the server (``GET /v1/loras``); omitted means the base model."""
    instructions: str | None = None
    """VoxCPM2's voice design: a description of the voice, applied to every sentence (``unsupported`` on
    models without it, and with a voice saved with its transcript)."""
    speed: float | None = None
    """Speaking speed in [0.25, 4.0], pitch kept (default 1.0)."""
    sample_rate: int | None = None
    """The rate of the audio, one of ``SAMPLE_RATES``, for a format in ``PCM_FORMATS`` only (omitted: the model's
    rate; 8000 for the G.711 formats)."""
    audio_transport: str | None = None
    """``binary`` (default): audio in binary frames; ``json``: base64 in ``audio`` text frames."""
    context_id: str | None = None

    def check(self) -> None:
        _check_range(self.format is None or self.format in FRAME_FORMATS, "format", f"one of {FRAME_FORMATS}")
        _check_range(self.seed is None or 0 <= self.seed < MAX_SEED, "seed", "in [0, 2**63)")
        _check_range(self.cfg_value is None or is_finite_number(self.cfg_value), "cfg_value", "finite")
        _check_range(self.inference_timesteps is None or self.inference_timesteps >= 1, "inference_timesteps", ">= 1")
        delay = self.max_buffer_delay_ms
        _check_range(delay is None or 0 <= delay <= MAX_BUFFER_DELAY_MS, "max_buffer_delay_ms", "in [0, 60000]")
        lead = self.playback_lead_ms
        _check_range(lead is None or 0 <= lead <= MAX_PLAYBACK_LEAD_MS, "playback_lead_ms", "in [0, 10000]")
        _check_range(self.max_ahead_ms is None or self.max_ahead_ms >= 1, "max_ahead_ms", ">= 1")
        speed = self.speed
        _check_range(speed is None or MIN_SPEED <= speed <= MAX_SPEED, "speed", f"in [{MIN_SPEED}, {MAX_SPEED}]")
        rate = self.sample_rate
        _check_range(rate is None or rate in SAMPLE_RATES, "sample_rate", f"one of {SAMPLE_RATES}")
        _check_range(rate is None or self.format in PCM_FORMATS, "sample_rate", f"set with a format of {PCM_FORMATS}")
        transport = self.audio_transport
        _check_range(
            transport is None or transport in AUDIO_TRANSPORTS, "audio_transport", f"one of {AUDIO_TRANSPORTS}"
        )
        check_context_id(self)


@dataclass(frozen=True)
class Text:
    """Append text to the open utterance (opening one if none is). Send the spaces between words."""

    type: ClassVar[str] = "text"
    text: str
    context_id: str | None = None

    def check(self) -> None:
        check_context_id(self)


@dataclass(frozen=True)
class Flush:
    """Speak everything buffered now, even an incomplete sentence; the utterance stays open."""

    type: ClassVar[str] = "flush"
    context_id: str | None = None

    def check(self) -> None:
        check_context_id(self)


@dataclass(frozen=True)
class End:
    """Close the open utterance: the rest of its text is spoken, then ``done`` follows."""

    type: ClassVar[str] = "end"
    context_id: str | None = None

    def check(self) -> None:
        check_context_id(self)


@dataclass(frozen=True)
class Cancel:
    """Stop every utterance of the context not yet done within one engine step and drop its buffered text; each
    gets ``done``."""

    type: ClassVar[str] = "cancel"
    context_id: str | None = None

    def check(self) -> None:
        check_context_id(self)


@dataclass(frozen=True)
class Ready:
    """Sent on connect and after each ``start``: the settings in effect for the next utterance."""

    type: ClassVar[str] = "ready"
    protocol: int
    model: str
    format: str
    sample_rate: int
    """Rate of the audio in the frames (Opus: its coding rate; decoders may output 48 kHz)."""
    chunk_s: float
    """Audio per model step; a frame usually carries one step's audio."""
    pre_skip: int
    """Opus only: 48 kHz samples to drop at the start of each utterance's decoded audio; else 0."""
    voice: str | None
    seed: int | None
    cfg_value: float
    inference_timesteps: int
    max_buffer_delay_ms: int
    playback_lead_ms: int
    """The listener lead the server schedules this connection's streams by."""
    persona: str | None
    """The LoRA persona the next utterances speak with (null: the base model)."""
    context_id: str | None = None


@dataclass(frozen=True)
class Segment:
    """A sentence of ``utterance`` starts: sent just before its first audio frame."""

    type: ClassVar[str] = "segment"
    utterance: int
    index: int
    text: str
    start_sample: int
    """Offset of its first sample in the utterance's audio, at ``ready.sample_rate`` (Opus: before pre-skip
    is applied, i.e. in the encoder's input timeline)."""
    spoken: str
    """What was spoken: ``text`` normalized when ``start.normalize`` is on, else ``text`` itself."""
    context_id: str | None = None


@dataclass(frozen=True)
class Words:
    """When some of a segment's words were spoken, estimated from the audio produced for it (not from the text alone:
    the speech's start, end and pace come from the audio's loudness, the split within it from the characters).
    A segment's words may come in several of these, in order, together its words once each, each after the audio
    frames it times (the first ones while the segment is still produced); ``words[i]`` spans ``starts_s[i]`` to
    ``ends_s[i]``, seconds from the utterance's first sample (the timeline of ``segment.start_sample``, after any
    ``speed``)."""

    type: ClassVar[str] = "words"
    utterance: int
    index: int
    """The segment's index (``segment.index``)."""
    words: tuple[str, ...]
    """The next of the segment's words (its text split at whitespace; punctuation stays with its word)."""
    starts_s: tuple[float, ...]
    ends_s: tuple[float, ...]
    context_id: str | None = None

    def check(self) -> None:
        if not len(self.words) == len(self.starts_s) == len(self.ends_s):
            raise ProtocolError(ErrorCode.INVALID_FIELD, "words, starts_s and ends_s must have one item per word")
        if not all(0 <= start <= end for start, end in zip(self.starts_s, self.ends_s, strict=True)):
            message = "words.starts_s and ends_s must be times >= 0, each end >= its start"
            raise ProtocolError(ErrorCode.OUT_OF_RANGE, message)


@dataclass(frozen=True)
class Done:
    """The last message of an utterance: no audio frame of it follows."""

    type: ClassVar[str] = "done"
    utterance: int
    finish_reason: str
    """A ``FinishReason`` value."""
    segments: int
    """Segments that started speaking."""
    audio_s: float
    """Audio of this utterance handed to the socket, in seconds (after a cancel: what the client got)."""
    ttfa_s: float | None
    """Time to first audio: the utterance's first ``text`` received to its first frame sent (null: none)."""
    buffer_s: float | None
    """Of ``ttfa_s``, the wait for a complete sentence (first text to first engine request)."""
    engine_ttfc_s: float | None
    """Of ``ttfa_s``, the engine's own time to first chunk (request submitted to first chunk out)."""
    context_id: str | None = None


@dataclass(frozen=True)
class Error:
    """Something was refused or failed; ``code`` is an ``ErrorCode`` value."""

    type: ClassVar[str] = "error"
    code: str
    message: str
    utterance: int | None = None
    """The utterance that failed, when the error ended one."""
    context_id: str | None = None
    """The context of the message refused, or of the utterance that failed."""


@dataclass(frozen=True)
class Audio:
    """An audio frame as a JSON text frame (``start.audio_transport`` ``json``): ``audio`` is the base64 (RFC 4648,
    with padding) of exactly the payload a binary frame would carry; the other fields are its header's."""

    type: ClassVar[str] = "audio"
    format: str
    utterance: int
    sequence: int
    audio: str
    context_id: str | None = None

    @classmethod
    def of(cls, frame: AudioFrame) -> Audio:
        payload = frame.payload()
        return cls(frame.format, frame.utterance, frame.sequence, base64.b64encode(payload).decode(), frame.context_id)

    def frame(self) -> AudioFrame:
        """The binary frame this message stands for. Raises ``ProtocolError`` (``bad_frame``)."""
        if self.format not in FRAME_FORMATS:
            raise ProtocolError(ErrorCode.BAD_FRAME, f"unknown audio format {self.format!r}")
        try:
            payload = base64.b64decode(self.audio, validate=True)
        except ValueError:
            raise ProtocolError(ErrorCode.BAD_FRAME, "audio is not base64") from None
        packets = _split_packets(payload) if self.format == "opus" else (payload,)
        return AudioFrame(self.format, self.utterance, self.sequence, packets, self.context_id)


@dataclass(frozen=True)
class CloseContext:
    """Cancel the context's utterances (as ``cancel``) and forget it: its settings are gone, its slot is free."""

    type: ClassVar[str] = "close_context"
    context_id: str

    def check(self) -> None:
        check_context_id(self)


ClientMessage = Start | Text | Flush | End | Cancel | CloseContext
ServerMessage = Ready | Segment | Words | Done | Error | Audio
JsonMessage = ClientMessage | ServerMessage
CLIENT_MESSAGES: dict[str, type[ClientMessage]] = {
    cls.type: cls for cls in (Start, Text, Flush, End, Cancel, CloseContext)
}
SERVER_MESSAGES: dict[str, type[ServerMessage]] = {cls.type: cls for cls in (Ready, Segment, Words, Done, Error, Audio)}


def check_context_id(message: ClientMessage) -> None:
    """A context id names a context: a non-empty string of at most ``MAX_CONTEXT_ID_BYTES`` UTF-8 bytes."""
    context = message.context_id
    if context is not None and not 0 < len(context.encode()) <= MAX_CONTEXT_ID_BYTES:
        raise ProtocolError(
            ErrorCode.OUT_OF_RANGE, f"{message.type}.context_id must have 1..{MAX_CONTEXT_ID_BYTES} UTF-8 bytes"
        )


def encode(message: JsonMessage) -> str:
    """The message as a compact JSON text frame, ``type`` first; client messages omit unset (None) fields, and
    server messages omit an unset ``context_id`` (so a client that uses no context sees the messages it always
    did)."""
    body = asdict(message)
    if message.type in CLIENT_MESSAGES:
        body = {name: value for name, value in body.items() if value is not None}
    elif body.get("context_id", "") is None:
        del body["context_id"]
    return json.dumps({"type": message.type, **body}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def decode_client(data: str | bytes) -> ClientMessage:
    """Parse a client's text frame. Raises ``ProtocolError``."""
    return _decode(data, CLIENT_MESSAGES)


def decode_server(data: str | bytes) -> ServerMessage:
    """Parse a server's text frame (for clients and tests). Raises ``ProtocolError``."""
    return _decode(data, SERVER_MESSAGES)


_M = typing.TypeVar("_M", ClientMessage, ServerMessage)


def _decode(data: str | bytes, registry: dict[str, type[_M]]) -> _M:
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ProtocolError(ErrorCode.INVALID_JSON, f"not a JSON text: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, 'a message is a JSON object with a string "type"')
    cls = registry.get(obj["type"])
    if cls is None:
        known = ", ".join(registry)
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {obj['type']!r} (expected one of {known})")
    message = cls(**_fields_of(cls, obj))
    check = getattr(message, "check", None)
    if check is not None:
        check()
    return message


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True)
class _FieldSpec:
    """One message field's wire rule, worked out once from its annotation."""

    name: str
    base: type
    """The JSON-facing Python type (str, int, float or bool; of each item for an array)."""
    optional: bool
    array: bool = False
    """A JSON array of ``base`` values (annotated ``tuple[base, ...]``)."""


def _field_specs(cls: type[Any]) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    specs = []
    for f in fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is tuple:  # tuple[base, ...]
            specs.append(_FieldSpec(f.name, typing.get_args(hint)[0], False, array=True))
            continue
        args = typing.get_args(hint)
        base = next(t for t in args or (hint,) if t is not type(None))
        specs.append(_FieldSpec(f.name, base, type(None) in args))
    return tuple(specs)


# Resolved at import, not per message: type-hint reflection costs far more than parsing a message.
_SPECS: dict[type[Any], tuple[_FieldSpec, ...]] = {
    cls: _field_specs(cls) for cls in (*CLIENT_MESSAGES.values(), *SERVER_MESSAGES.values())
}
_NAMES: dict[type[Any], frozenset[str]] = {cls: frozenset(spec.name for spec in specs) for cls, specs in _SPECS.items()}


def _fields_of(cls: type[Any], obj: dict[str, Any]) -> dict[str, Any]:
    """The dataclass fields of ``cls`` from ``obj``, each checked against its annotation."""
    kind, names = obj["type"], _NAMES[cls]
    for name in obj:
        if name != "type" and name not in names:
            raise ProtocolError(ErrorCode.UNKNOWN_FIELD, f"{kind!r} has no field {name!r}")
    values: dict[str, Any] = {}
    for spec in _SPECS[cls]:
        if spec.name in obj:
            values[spec.name] = _typed(kind, spec, obj[spec.name])
        elif not spec.optional:
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{kind!r} needs the field {spec.name!r}")
    return values


_JSON_TYPES: dict[type, str] = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def _typed(kind: str, spec: _FieldSpec, value: Any) -> Any:
    if spec.array:
        if not isinstance(value, list):
            message = f"{kind}.{spec.name} must be an array, got {_json_type(value)}"
            raise ProtocolError(ErrorCode.INVALID_FIELD, message)
        item = replace(spec, name=f"{spec.name}[]", array=False)
        return tuple(_typed(kind, item, each) for each in value)
    if value is None and spec.optional:
        return None
    name, base = spec.name, spec.base
    ok = isinstance(value, base) and (base is bool or not isinstance(value, bool))
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        if not is_finite_number(value):
            raise ProtocolError(ErrorCode.OUT_OF_RANGE, f"{kind}.{name} is too large for a number")
        value, ok = float(value), True
    if base is str and ok and not is_unicode(value):
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{kind}.{name} is not valid Unicode (a lone surrogate)")
    if not ok:
        allowed = _JSON_TYPES[base] + (" or null" if spec.optional else "")
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{kind}.{name} must be {allowed}, got {_json_type(value)}")
    return value


def is_unicode(text: str) -> bool:
    """Whether ``text`` can be sent as UTF-8 (JSON's ``\\ud800`` escapes decode to lone surrogates, which cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _check_range(ok: bool, name: str, rule: str) -> None:
    if not ok:
        raise ProtocolError(ErrorCode.OUT_OF_RANGE, f"start.{name} must be {rule}")


# ---- binary audio frames ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AudioFrame:
    """One binary frame: audio of ``utterance``, in order by ``sequence``.

    ``packets`` holds Opus packets for ``opus`` and a single block of bytes for the other formats.
    ``context_id`` (a header extension) names the context of the utterance; None: the default context, whose
    frames keep the 12-byte header.
    """

    format: str
    utterance: int
    sequence: int
    packets: tuple[bytes, ...]
    context_id: str | None = None

    def encode(self) -> bytes:
        extension = _context_extension(self.context_id)
        header = _FRAME_HEADER.pack(
            FRAME_VERSION,
            FRAME_FORMATS.index(self.format),
            _FRAME_HEADER.size + len(extension),
            self.utterance,
            self.sequence,
        )
        return header + extension + self.payload()

    def payload(self) -> bytes:
        """The bytes after the header: Opus packets each behind its u16 length, else the format's bytes."""
        if self.format != "opus":
            return b"".join(self.packets)
        parts = []
        for packet in self.packets:
            if not 0 < len(packet) <= MAX_PACKET_BYTES:
                raise ValueError(f"an Opus packet must have 1..{MAX_PACKET_BYTES} bytes, got {len(packet)}")
            parts += [_PACKET_LENGTH.pack(len(packet)), packet]
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> AudioFrame:
        """Parse a frame. Raises ``ProtocolError`` with ``ErrorCode.BAD_FRAME``."""
        if len(data) < _FRAME_HEADER.size:
            raise ProtocolError(ErrorCode.BAD_FRAME, f"a frame has at least {_FRAME_HEADER.size} bytes")
        version, fmt, header_size, utterance, sequence = _FRAME_HEADER.unpack_from(data)
        if version != FRAME_VERSION or fmt >= len(FRAME_FORMATS) or not _FRAME_HEADER.size <= header_size <= len(data):
            raise ProtocolError(ErrorCode.BAD_FRAME, f"bad header: version {version}, format {fmt}, size {header_size}")
        context_id = _read_extensions(data[_FRAME_HEADER.size : header_size])
        payload = data[header_size:]
        name = FRAME_FORMATS[fmt]
        packets = _split_packets(payload) if name == "opus" else (payload,)
        return cls(name, utterance, sequence, packets, context_id)


def _context_extension(context_id: str | None) -> bytes:
    """The header extension naming ``context_id`` (none for the default context), zero-padded so the header stays
    a multiple of 4 bytes (PCM payloads 4-byte aligned)."""
    if context_id is None:
        return b""
    value = context_id.encode()
    field = _EXTENSION.pack(_CONTEXT_TAG, len(value)) + value
    return field + bytes(-(_FRAME_HEADER.size + len(field)) % 4)


def _read_extensions(extensions: bytes) -> str | None:
    """The context id among the header's extension fields; fields of unknown tags are skipped."""
    context_id, offset = None, 0
    while offset < len(extensions) and extensions[offset] != _PADDING_TAG:
        if offset + _EXTENSION.size > len(extensions):
            raise ProtocolError(ErrorCode.BAD_FRAME, "truncated header extension")
        tag, size = _EXTENSION.unpack_from(extensions, offset)
        offset += _EXTENSION.size
        if offset + size > len(extensions):
            raise ProtocolError(ErrorCode.BAD_FRAME, f"header extension of {size} bytes does not fit the header")
        if tag == _CONTEXT_TAG:
            try:
                context_id = extensions[offset : offset + size].decode()
            except UnicodeDecodeError:
                raise ProtocolError(ErrorCode.BAD_FRAME, "the context id is not UTF-8") from None
        offset += size
    return context_id


def _split_packets(payload: bytes) -> tuple[bytes, ...]:
    packets, offset = [], 0
    while offset < len(payload):
        if offset + _PACKET_LENGTH.size > len(payload):
            raise ProtocolError(ErrorCode.BAD_FRAME, "truncated packet length")
        (size,) = _PACKET_LENGTH.unpack_from(payload, offset)
        offset += _PACKET_LENGTH.size
        if size == 0 or offset + size > len(payload):
            raise ProtocolError(ErrorCode.BAD_FRAME, f"packet of {size} bytes at offset {offset} does not fit")
        packets.append(payload[offset : offset + size])
        offset += size
    return tuple(packets)
