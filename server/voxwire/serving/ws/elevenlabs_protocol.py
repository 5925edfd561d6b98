"""ElevenLabs' text-to-speech WebSocket messages, as its API reference documents them: parsing and building.

Two endpoints share them (``elevenlabs.py`` serves both): ``stream-input`` (one context per socket) and
``multi-stream-input`` (contexts named by ``context_id``). A client message is one JSON object whose fields
say what it does (``ElevenMessage``): text to append (``" "`` alone opens a context), ``flush``,
``close_context``, ``close_socket``, an empty text (end of input on ``stream-input``, a keep-alive on
``multi-stream-input``), and on a context's first message ``voice_settings``, ``generation_config`` and
``xi_api_key`` (or ``"xi-api-key"``, as the SDK's ``InitializeConnection`` type writes it). Of ``voice_settings``
only ``speed`` is honoured (``VOICE_SPEEDS``); fields this server has no use for are read and ignored, as the
reference allows.

Server messages carry base64 ``audio`` in the ``output_format`` the query asked for
(``audio/elevenlabs_formats.py``),
character ``alignment``/``normalizedAlignment`` (start and duration in ms of each character: relative to the
message, as the reference says, or, with ``sync_alignment=true``, from the start of the context's audio, as
LiveKit's plugin reads them), ``isFinal`` at the end of a context, and ``contextId`` on the multi-context
endpoint. Sans I/O: nothing here touches a socket.
"""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import dataclass
from typing import Any

from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import MAX_CONTEXT_ID_BYTES, ProtocolError, is_unicode
from voxwire.serving.speech.alignment import Alignment

STREAM_INPUT_PATH = "/v1/text-to-speech/{voice_id}/stream-input"
MULTI_STREAM_INPUT_PATH = "/v1/text-to-speech/{voice_id}/multi-stream-input"

DEFAULT_CONTEXT_ID = "default"
"""The context a ``multi-stream-input`` message without ``context_id`` addresses."""

VOICE_SPEEDS = (0.7, 1.2)
"""The ``voice_settings.speed`` range ElevenLabs documents for its WebSocket (``RealtimeVoiceSettings``);
outside it a message is refused with ``out_of_range``."""


@dataclass(frozen=True)
class ElevenMessage:
    """One client message; each field is None/False when absent."""

    text: str | None = None
    context_id: str | None = None
    flush: bool = False
    close_context: bool = False
    close_socket: bool = False
    api_key: str | None = None
    """``xi_api_key`` (or ``"xi-api-key"``), or the key of an ``authorization: Bearer <key>`` field."""
    speed: float | None = None
    """``voice_settings.speed``, in ``VOICE_SPEEDS``."""


_BOOLEANS = ("flush", "close_context", "close_socket")
_KEYS = ("xi_api_key", "xi-api-key")
_STRINGS = ("text", "context_id", *_KEYS, "authorization")
_OBJECTS = ("voice_settings", "generation_config")


def parse_client(data: str) -> ElevenMessage:
    """Parse a client's text frame. Raises ``ProtocolError`` (not JSON, not an object, a field of the wrong type)."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"not a JSON text: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "a message is a JSON object")
    _check_types(obj, _BOOLEANS, bool, "a boolean")
    _check_types(obj, _STRINGS, str, "a string")
    _check_types(obj, _OBJECTS, dict, "an object")
    _check_context_id(obj.get("context_id"))
    key = next((obj[name] for name in _KEYS if obj.get(name)), None)
    scheme, _, bearer = (obj.get("authorization") or "").partition(" ")
    if key is None and scheme.lower() == "bearer" and bearer.strip():
        key = bearer.strip()
    return ElevenMessage(
        text=obj.get("text"),
        context_id=obj.get("context_id"),
        flush=obj.get("flush") is True,
        close_context=obj.get("close_context") is True,
        close_socket=obj.get("close_socket") is True,
        api_key=key or None,
        speed=voice_settings_speed(obj.get("voice_settings") or {}),
    )


def voice_settings_speed(voice_settings: dict[str, Any]) -> float | None:
    """``voice_settings.speed`` (None: not set), checked: raises ``ProtocolError`` (``invalid_field`` for a value that
    is not a number, ``out_of_range`` outside ``VOICE_SPEEDS``). The other voice settings (``stability``,
    ``similarity_boost``, ``style``, ``use_speaker_boost``) are ElevenLabs' model's and ignored here."""
    speed = voice_settings.get("speed")
    if speed is None:
        return None
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "voice_settings.speed must be a number")
    low, high = VOICE_SPEEDS
    if not low <= speed <= high:  # NaN included
        raise ProtocolError(ErrorCode.OUT_OF_RANGE, f"voice_settings.speed must be in [{low}, {high}], got {speed}")
    return float(speed)


def _check_types(obj: dict[str, Any], names: tuple[str, ...], kind: type, described: str) -> None:
    for name in names:
        if obj.get(name) is not None and not isinstance(obj[name], kind):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{name} must be {described}")
        if isinstance(obj.get(name), str) and not is_unicode(obj[name]):  # "\\ud800": no reply could carry it
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"{name} is not valid Unicode (a lone surrogate)")


def _check_context_id(context_id: str | None) -> None:
    """As on our own endpoint: the id is repeated in every message of its context, so it is short."""
    if context_id is not None and len(context_id.encode()) > MAX_CONTEXT_ID_BYTES:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"context_id is limited to {MAX_CONTEXT_ID_BYTES} UTF-8 bytes")


# ---- server messages --------------------------------------------------------------------------------------------


def audio_message(audio: bytes, context_id: str | None) -> dict[str, Any]:
    """A chunk of audio; its characters' timings come in an ``alignment_message`` once the sentence is spoken."""
    return _in_context({"audio": base64.b64encode(audio).decode(), "alignment": None, "normalizedAlignment": None},
                       context_id)  # fmt: skip


def alignment_message(alignment: Alignment, offset_s: float, context_id: str | None) -> dict[str, Any]:
    """The timings of one spoken sentence, with no audio; ``offset_s`` is added to every time (0: relative to the
    sentence, as the reference describes them). ``normalizedAlignment`` is the same: this server does not normalize
    what these endpoints are sent.

    The characters are the sentence and a trailing space that covers the silence after the speech, so that a
    message's span (its last character's start plus duration) is the sentence's whole audio: a client that
    keeps its clock by adding each message's span, as the reference's relative times imply, stays exact."""
    timings = _timings(alignment, offset_s)
    return _in_context({"audio": "", "alignment": timings, "normalizedAlignment": timings}, context_id)


def final_message(context_id: str | None) -> dict[str, Any]:
    return _in_context({"isFinal": True}, context_id)


def error_message(code: ErrorCode | str, message: str, context_id: str | None) -> dict[str, Any]:
    return _in_context({"error": str(getattr(code, "value", code)), "message": message}, context_id)


def _in_context(body: dict[str, Any], context_id: str | None) -> dict[str, Any]:
    return body if context_id is None else {**body, "contextId": context_id}


def _timings(alignment: Alignment, offset_s: float) -> dict[str, list[Any]]:
    bounds = [round((offset_s + t) * 1000) for t in (*alignment.starts_s, alignment.end_s, alignment.duration_s)]
    return {
        "chars": [*alignment.text, " "],
        "charStartTimesMs": bounds[:-1],
        "charDurationsMs": [end - start for start, end in itertools.pairwise(bounds)],
    }
