"""A voice clip carried in a JSON body (``/v1/audio/speech``'s ``ref_audio``, vLLM-Omni's per-request cloning) as the
voice a ``Speaker`` speaks with: ``inline_voice``.

The clip is a base64 data URI (``data:audio/wav;base64,...``) or bare base64 of an audio file; a URL is refused
(the server fetches nothing a client names: no request forgery, no waiting on a third party). It is held to an
upload's limits (``--max-upload-bytes`` decoded, ``--max-clip-seconds``), decoded and encoded in a voice-job slot as
an upload is (``clips.encode_voice_clip``), and kept encoded (``InlineVoices``): the same clip again is neither
decoded nor encoded.
"""

from __future__ import annotations

import base64
import binascii
import re

from aiohttp import web

from voxwire.prompt import VoicePrompt
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.http.clips import encode_voice_clip
from voxwire.serving.runtime.keys import CONFIG_KEY, INLINE_VOICES_KEY, SPEAKER_KEY
from voxwire.serving.speech.inline_voices import clip_key

_DATA_URI = re.compile(r"data:(?P<media>[^,]*?)(?P<base64>;base64)?,(?P<data>.*)", re.DOTALL | re.IGNORECASE)
_URL = re.compile(r"[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")


async def inline_voice(app: web.Application, clip: str, transcript: str | None, *, field: str) -> VoicePrompt:
    """The voice ``clip`` (a body's ``field``: data URI or base64) makes with ``transcript`` (a continuation prompt;
    None or blank: a reference clip, on a model that clones one), encoded once per clip and transcript.

    Raises ``ApiError``: ``invalid_audio`` (a URL, not base64, not audio), ``upload_too_large``, ``clip_too_long``,
    ``transcript_required`` (no transcript on a model that needs one), ``busy`` (every voice-job slot taken).
    """
    audio = clip_bytes(clip, field, app[CONFIG_KEY].voices.max_upload_bytes)
    spoken = transcript.strip() if transcript is not None else ""
    text = spoken or None
    if text is None and not app[SPEAKER_KEY].info.reference_cloning:
        raise ApiError(ErrorCode.TRANSCRIPT_REQUIRED, f"this model clones a voice from '{field}' and its transcript")
    voices, key = app[INLINE_VOICES_KEY], clip_key(audio, text)
    voice = voices.get(key)
    if voice is None:
        voice = (await encode_voice_clip(app, audio, text)).prompt
        voices.put(key, voice)
    return voice


def clip_bytes(value: str, field: str, max_bytes: int) -> bytes:
    """The audio file ``value`` carries (a base64 data URI or bare base64; whitespace ignored), at most
    ``max_bytes``; ``ApiError`` ``invalid_audio`` for a URL or anything not base64, ``upload_too_large``."""
    if _URL.match(value):
        message = f"'{field}' is a URL; this server fetches nothing: send the clip itself, as a base64 data URI"
        raise ApiError(ErrorCode.INVALID_AUDIO, message)
    encoded = value
    if value[:5].lower() == "data:":
        uri = _DATA_URI.fullmatch(value)
        if uri is None or uri["base64"] is None:
            raise ApiError(ErrorCode.INVALID_AUDIO, f"'{field}' must be a base64 data URI (data:audio/wav;base64,...)")
        encoded = uri["data"]
    encoded = _WHITESPACE.sub("", encoded)
    if 3 * (len(encoded) // 4) > max_bytes + 2:  # refused from its length, before decoding
        raise ApiError(ErrorCode.UPLOAD_TOO_LARGE, f"'{field}' holds more than the limit of {max_bytes} bytes")
    try:
        audio = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(ErrorCode.INVALID_AUDIO, f"'{field}' is not base64: {exc}") from exc
    if not audio:
        raise ApiError(ErrorCode.INVALID_AUDIO, f"'{field}' holds no audio")
    if len(audio) > max_bytes:
        raise ApiError(ErrorCode.UPLOAD_TOO_LARGE, f"'{field}' holds more than the limit of {max_bytes} bytes")
    return audio
