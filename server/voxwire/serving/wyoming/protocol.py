"""Wyoming, sans I/O: the event codec (``EventDecoder``, ``encode_event``), the ``info`` answer, and
``WyomingCore``, the rules of one connection. The asyncio listener (``listener.py``) feeds it bytes and the time,
and carries out the actions it returns, in order.

An event is one line of JSON (``type``, optional ``data``, ``data_length``, ``payload_length``), then
``data_length`` bytes of JSON merged into ``data``, then ``payload_length`` bytes of payload. A client of a TTS server
sends:

* ``describe``: answered with ``info`` (one TTS program, ``voxwire``, its voices, streaming supported);
* ``synthesize`` (``text``, optional ``voice.name``): the text is one utterance, answered with ``audio-start``,
  ``audio-chunk``s (s16le at the model's rate) as the engine makes them, and ``audio-stop``;
* ``synthesize-start`` (optional ``voice.name``), ``synthesize-chunk``s (``text``), ``synthesize-stop``: the text is
  cut into sentences as it streams (``SentenceSegmenter``, as on the WebSocket), each sentence answered with its own
  ``audio-start``/``audio-chunk``s/``audio-stop`` as soon as it is complete, and the stream with
  ``synthesize-stopped``, as Piper's server does. A ``synthesize`` inside a stream is dropped: Home Assistant sends one
  there for servers that do not stream;
* ``ping``: answered with ``pong``.

Events of other types are dropped, as the protocol asks of a server. A bad event is answered with an ``error`` event
(``text``, ``code``: our ``ErrorCode`` values) and changes nothing else; the connection is closed after its ``error``
only when the byte stream cannot be followed any more (an event past ``max_event_bytes``: 4 bytes a character of
``max_text_chars_per_utterance`` and 64 KiB, as an HTTP speech body; a length that is not a count), when the client
floods (``max_messages_per_s``), or when it was idle for ``idle_timeout_s``.
Requests not yet done (a ``synthesize``, or a stream until its ``synthesize-stop`` is answered) are bounded by
``max_queued_utterances``, a ``synthesize``'s text and a stream's whole text by ``max_text_chars_per_utterance``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.ws.budget import MessageBudget
from voxwire.serving.ws.session_core import sayable
from voxwire.speech_model import ModelInfo
from voxwire.text.segmenter import SentenceSegmenter

WYOMING_VERSION = "1.10.2"
"""The ``version`` in every event's header: the Wyoming release this server was tested against."""

SAMPLE_WIDTH = 2
"""Bytes per sample of the audio sent: 16-bit little-endian PCM, mono."""

EVENT_OVERHEAD_BYTES = 64 * 1024
"""Room for the JSON around a text in an event (its header line and the rest of its data)."""

PROGRAM_NAME = "voxwire"
VOXCPM_URL = "https://github.com/OpenBMB/VoxCPM"

VOXCPM1_LANGUAGES = ("en", "zh")
VOXCPM2_LANGUAGES = (
    "ar", "da", "de", "el", "en", "es", "fi", "fr", "he", "hi", "id", "it", "ja", "km", "ko", "lo", "ms", "my",
    "nl", "no", "pl", "pt", "ru", "sv", "sw", "th", "tl", "tr", "vi", "zh",
)  # fmt: skip
"""The 30 languages VoxCPM2's model card lists (ISO 639-1); VoxCPM 0.5B and 1.5 speak English and Chinese."""


def model_languages(info: ModelInfo) -> tuple[str, ...]:
    """The languages the served model speaks. Voice design is what tells VoxCPM2 from the earlier models in
    ``ModelInfo`` (``ModelConfig.voice_design``: VoxCPM2 only)."""
    return VOXCPM2_LANGUAGES if info.voice_design else VOXCPM1_LANGUAGES


@dataclass(frozen=True, slots=True)
class WyomingEvent:
    """One event, either way."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""


@dataclass(frozen=True, slots=True)
class BadEvent:
    """Bytes that are not a readable event: answered with an ``error``; ``fatal``: the stream cannot be followed
    past them, so the connection closes after the ``error``."""

    code: ErrorCode
    text: str
    fatal: bool = False


def encode_event(event: WyomingEvent) -> bytes:
    """The bytes of ``event``: its header line, its data as JSON after it (``data_length``), then its payload."""
    header: dict[str, Any] = {"type": event.type, "version": WYOMING_VERSION}
    data = json.dumps(event.data, ensure_ascii=False).encode() if event.data else b""
    if data:
        header["data_length"] = len(data)
    if event.payload:
        header["payload_length"] = len(event.payload)
    return json.dumps(header, ensure_ascii=False).encode() + b"\n" + data + event.payload


def error_event(code: ErrorCode, text: str) -> WyomingEvent:
    return WyomingEvent("error", {"text": text, "code": code.value})


class EventDecoder:
    """Reads events out of the bytes of a connection, whatever their split; one event (its header line, data and
    payload) is at most ``max_event_bytes``."""

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._buffer = bytearray()
        self._header: dict[str, Any] | None = None
        """The header line read whose data and payload have not all arrived yet."""
        self._body_bytes = 0
        self._broken = False

    def feed(self, data: bytes) -> list[WyomingEvent | BadEvent]:
        """The events (and bad events) that ``data`` completes, in order; nothing after a fatal one."""
        if self._broken:
            return []
        self._buffer += data
        read: list[WyomingEvent | BadEvent] = []
        while (item := self._next()) is not None:
            read.append(item)
            if isinstance(item, BadEvent) and item.fatal:
                self._broken = True
                self._buffer.clear()
                break
        return read

    def _next(self) -> WyomingEvent | BadEvent | None:
        if self._header is None:
            end = self._buffer.find(b"\n")
            if end == -1:
                if len(self._buffer) > self.max_event_bytes:
                    text = f"an event header line is over {self.max_event_bytes} bytes"
                    return BadEvent(ErrorCode.MESSAGE_TOO_LARGE, text, fatal=True)
                return None
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if not line.strip():
                return self._next()  # a blank line between events carries nothing
            return self._read_header(line)
        if len(self._buffer) < self._body_bytes:
            return None
        header, self._header = self._header, None
        body = bytes(self._buffer[: self._body_bytes])
        del self._buffer[: self._body_bytes]
        return _event_of(header, body)

    def _read_header(self, line: bytes) -> WyomingEvent | BadEvent | None:
        try:
            header = json.loads(line)
        except ValueError:  # UnicodeDecodeError is one
            return BadEvent(ErrorCode.INVALID_JSON, "an event header line is not UTF-8 JSON")
        if not isinstance(header, dict) or not isinstance(header.get("type"), str):
            return BadEvent(ErrorCode.INVALID_MESSAGE, "an event header is not a JSON object with a string 'type'")
        lengths = [header.get(name) for name in ("data_length", "payload_length")]
        if not all(length is None or (type(length) is int and length >= 0) for length in lengths):
            text = "'data_length' and 'payload_length' must be counts of bytes"
            return BadEvent(ErrorCode.INVALID_FIELD, text, fatal=True)
        body = sum(length or 0 for length in lengths)
        if len(line) + body > self.max_event_bytes:
            text = f"an event of {len(line) + body} bytes is over the server's {self.max_event_bytes}"
            return BadEvent(ErrorCode.MESSAGE_TOO_LARGE, text, fatal=True)
        self._header, self._body_bytes = header, body
        return self._next()


def _event_of(header: dict[str, Any], body: bytes) -> WyomingEvent | BadEvent:
    """The event a header and the bytes after it make: ``data`` merged with the data part, then the payload."""
    data, data_length = header.get("data", {}), header.get("data_length") or 0
    if not isinstance(data, dict):
        return BadEvent(ErrorCode.INVALID_FIELD, "an event's 'data' must be a JSON object")
    if data_length:
        try:
            extra = json.loads(body[:data_length])
        except ValueError:
            return BadEvent(ErrorCode.INVALID_JSON, "an event's data is not UTF-8 JSON")
        if not isinstance(extra, dict):
            return BadEvent(ErrorCode.INVALID_FIELD, "an event's data must be a JSON object")
        data = {**data, **extra}
    return WyomingEvent(header["type"], data, body[data_length:])


@dataclass(frozen=True, slots=True)
class VoiceEntry:
    """A voice ``info`` lists: its name (what ``synthesize`` asks for) and a description for people."""

    name: str
    description: str


def info_event(info: ModelInfo, voices: list[VoiceEntry], version: str) -> WyomingEvent:
    """The answer to ``describe``: one TTS program, ``voxwire``, speaking ``voices`` in the model's languages."""
    languages = list(model_languages(info))
    attribution = {"name": "OpenBMB (VoxCPM)", "url": VOXCPM_URL}

    def artifact(name: str, description: str) -> dict[str, Any]:
        return {"name": name, "description": description, "attribution": attribution, "installed": True,
                "version": version}  # fmt: skip

    program = {
        **artifact(PROGRAM_NAME, f"{info.name} text to speech, served by voxwire"),
        "voices": [{**artifact(voice.name, voice.description), "languages": languages} for voice in voices],
        "supports_synthesize_streaming": True,
    }
    return WyomingEvent("info", {"asr": [], "tts": [program], "handle": [], "intent": [], "wake": [], "mic": [],
                                 "snd": []})  # fmt: skip


# ---- one connection --------------------------------------------------------------------------------------------


class StreamPhase(enum.Enum):
    """Whether the connection is inside a ``synthesize-start`` ... ``synthesize-stop`` stream."""

    IDLE = "idle"
    """No stream: a ``synthesize`` is spoken whole."""
    STREAMING = "streaming"
    """A stream's sentences are spoken as they complete."""
    REFUSED = "refused"
    """A stream whose start or text was refused (its ``error`` sent): its events are taken and dropped, and its
    ``synthesize-stop`` is still answered with ``synthesize-stopped``, so the client's wait ends as usual."""


class SpeechPart(enum.Enum):
    """What a ``Speak`` is."""

    WHOLE = "whole"
    """A ``synthesize``'s whole text, one request."""
    FIRST_SENTENCE = "first_sentence"
    """A stream's first sentence: the stream's voice starts here."""
    NEXT_SENTENCE = "next_sentence"
    """A later sentence of the stream: it continues the voice of the one before."""


@dataclass(frozen=True, slots=True)
class SendInfo:
    """Answer ``describe`` (the voices are the server's when it is sent)."""


@dataclass(frozen=True, slots=True)
class Send:
    """Send this event."""

    event: WyomingEvent


@dataclass(frozen=True, slots=True)
class Speak:
    """Speak ``text`` in ``voice`` (None: the default voice) and send its audio between ``audio-start`` and
    ``audio-stop``; a failure is sent as an ``error``."""

    text: str
    voice: str | None
    part: SpeechPart


@dataclass(frozen=True, slots=True)
class EndStream:
    """Send ``synthesize-stopped``: the stream's sentences are all sent."""


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection, after what was sent before."""


Action = SendInfo | Send | Speak | EndStream | Close


@dataclass(frozen=True)
class WyomingLimits:
    """The per-connection limits (``ServerConfig.limits`` fields of the same names)."""

    max_messages_per_s: float
    max_text_chars_per_utterance: int
    max_queued_utterances: int
    idle_timeout_s: float

    @property
    def max_event_bytes(self) -> int:
        """The largest event read: a ``synthesize`` of the longest text (UTF-8 is at most 4 bytes a character)
        and room for the JSON around it."""
        return 4 * self.max_text_chars_per_utterance + EVENT_OVERHEAD_BYTES


class WyomingCore:
    """The rules of one connection (see the module's docstring): ``receive`` bytes, ``released`` when a request's
    last event is sent, ``tick`` at ``deadline``; each returns the actions to carry out, in order."""

    def __init__(self, limits: WyomingLimits, knows_voice: Callable[[str], bool], now: float) -> None:
        self.limits = limits
        self._knows_voice = knows_voice
        """Whether a voice name is one of the server's now (a built-in name or a saved voice)."""
        self.phase = StreamPhase.IDLE
        self.closed = False
        self._decoder = EventDecoder(limits.max_event_bytes)
        self._budget = MessageBudget(limits.max_messages_per_s, now)
        self._unfinished = 0
        """Requests taken and not yet answered whole: ``synthesize``s, and the open stream."""
        self._last_activity = now
        self._segmenter = SentenceSegmenter()
        self._stream_voice: str | None = None
        self._stream_chars = 0
        self._stream_spoken = False

    def receive(self, data: bytes, now: float) -> list[Action]:
        """The client's bytes: the actions of the events they complete."""
        actions: list[Action] = []
        for item in self._decoder.feed(data):
            if self.closed:
                break
            self._last_activity = now
            if not self._budget.spend(now):
                text = f"more than {self.limits.max_messages_per_s:g} events a second"
                actions += self._close(ErrorCode.RATE_LIMITED, text)
            elif isinstance(item, BadEvent):
                actions += (
                    self._close(item.code, item.text) if item.fatal else [Send(error_event(item.code, item.text))]
                )
            else:
                actions += self._handle(item)
        return actions

    def released(self, now: float) -> None:
        """A request's last event (``audio-stop``, ``synthesize-stopped`` or its ``error``) is sent."""
        self._unfinished -= 1
        self._last_activity = now

    def deadline(self) -> float | None:
        """When the connection is idle past ``idle_timeout_s``, if nothing happens meanwhile; None while a
        request is unfinished."""
        return None if self._unfinished or self.closed else self._last_activity + self.limits.idle_timeout_s

    def tick(self, now: float) -> list[Action]:
        """The time is ``now``: past the deadline, the connection is closed (``idle_timeout``)."""
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return []
        return self._close(ErrorCode.IDLE_TIMEOUT, f"no event for {self.limits.idle_timeout_s:g} s")

    def _close(self, code: ErrorCode, text: str) -> list[Action]:
        self.closed = True
        return [Send(error_event(code, text)), Close()]

    def _handle(self, event: WyomingEvent) -> list[Action]:
        kind, data = event.type, event.data
        if kind == "describe":
            return [SendInfo()]
        if kind == "ping":
            text = data.get("text")
            return [Send(WyomingEvent("pong", {"text": text} if isinstance(text, str) else {}))]
        if kind == "synthesize":
            return [] if self.phase is not StreamPhase.IDLE else self._synthesize(data)
        if kind == "synthesize-start":
            return self._start(data)
        if kind == "synthesize-chunk":
            return self._chunk(data)
        if kind == "synthesize-stop":
            return self._stop()
        return []  # other types are dropped, as the protocol asks of a server

    def _refuse(self, code: ErrorCode, text: str) -> list[Action]:
        return [Send(error_event(code, text))]

    def _synthesize(self, data: dict[str, Any]) -> list[Action]:
        text = data.get("text")
        if not isinstance(text, str):
            return self._refuse(ErrorCode.INVALID_FIELD, "'synthesize' needs a string 'text'")
        voice, refused = self._voice(data)
        if refused:
            return refused
        limit = self.limits.max_text_chars_per_utterance
        if len(text) > limit:
            return self._refuse(ErrorCode.TEXT_TOO_LONG, f"'text' has {len(text)} characters, over the {limit} allowed")
        if not sayable(text):
            return self._refuse(ErrorCode.EMPTY_UTTERANCE, "'text' has nothing to say (no letter or digit)")
        if refused := self._full():
            return refused
        self._unfinished += 1
        return [Speak(text.strip(), voice, SpeechPart.WHOLE)]

    def _start(self, data: dict[str, Any]) -> list[Action]:
        if self.phase is not StreamPhase.IDLE:
            return self._refuse(ErrorCode.UTTERANCE_IN_PROGRESS, "a stream is open: send 'synthesize-stop' first")
        self._unfinished += 1  # the stream, until its synthesize-stopped
        self._segmenter, self._stream_chars, self._stream_spoken = SentenceSegmenter(), 0, False
        voice, refused = self._voice(data)
        if not refused and self._unfinished > self.limits.max_queued_utterances:
            refused = self._too_many()
        self.phase = StreamPhase.REFUSED if refused else StreamPhase.STREAMING
        self._stream_voice = voice
        return refused

    def _chunk(self, data: dict[str, Any]) -> list[Action]:
        if self.phase is StreamPhase.IDLE:
            return self._refuse(ErrorCode.INVALID_MESSAGE, "'synthesize-chunk' outside a stream ('synthesize-start')")
        if self.phase is StreamPhase.REFUSED:
            return []
        text = data.get("text")
        if not isinstance(text, str):
            return self._refuse(ErrorCode.INVALID_FIELD, "'synthesize-chunk' needs a string 'text'")
        self._stream_chars += len(text)
        limit = self.limits.max_text_chars_per_utterance
        if self._stream_chars > limit:
            self.phase = StreamPhase.REFUSED
            text = f"the stream's text is over the {limit} characters allowed: the rest of the stream is dropped"
            return self._refuse(ErrorCode.UTTERANCE_TOO_LONG, text)
        return self._sentences(self._segmenter.push(text))

    def _stop(self) -> list[Action]:
        if self.phase is StreamPhase.IDLE:
            return self._refuse(ErrorCode.INVALID_MESSAGE, "'synthesize-stop' outside a stream ('synthesize-start')")
        spoken = self._sentences(self._segmenter.flush()) if self.phase is StreamPhase.STREAMING else []
        self.phase = StreamPhase.IDLE
        return [*spoken, EndStream()]

    def _sentences(self, sentences: list[str]) -> list[Action]:
        actions: list[Action] = []
        for sentence in filter(sayable, sentences):
            part = SpeechPart.NEXT_SENTENCE if self._stream_spoken else SpeechPart.FIRST_SENTENCE
            self._stream_spoken = True
            actions.append(Speak(sentence, self._stream_voice, part))
        return actions

    def _voice(self, data: dict[str, Any]) -> tuple[str | None, list[Action]]:
        """The voice a request names (``voice.name``; a ``voice`` with only a ``language`` names the default one),
        or the refusal of a malformed one."""
        voice = data.get("voice")
        if voice is None:
            return None, []
        name = voice.get("name") if isinstance(voice, dict) else None
        if not isinstance(voice, dict) or not (name is None or isinstance(name, str)):
            return None, self._refuse(ErrorCode.INVALID_FIELD, "'voice' must be an object with a string 'name'")
        if name is not None and not self._knows_voice(name):
            return None, self._refuse(ErrorCode.UNKNOWN_VOICE, f"no voice {name!r}: 'describe' lists the voices")
        return name, []

    def _full(self) -> list[Action]:
        return self._too_many() if self._unfinished >= self.limits.max_queued_utterances else []

    def _too_many(self) -> list[Action]:
        limit = self.limits.max_queued_utterances
        return self._refuse(ErrorCode.TOO_MANY_UTTERANCES, f"{limit} requests of this connection are not done yet")
