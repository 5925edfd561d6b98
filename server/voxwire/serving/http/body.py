"""Reading request bodies: bounded in size (``client_max_size``, per-route limits) and in time
(``body_timeout_s``), decoded to JSON with a typed error for every way a body can be wrong."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.runtime.timeouts import within
from voxwire.serving.server_config import ServerConfig

T = TypeVar("T")


async def read_json(request: web.Request, timeout_s: float, max_bytes: int | None = None) -> object:
    """The request body as JSON, read within ``timeout_s``, decoded in its declared charset (UTF-8 by default);
    ``max_bytes`` replaces the application's body limit for this route (413 ``payload_too_large`` beyond it).

    Raises ``ApiError`` for a slow body (408), an unknown charset, undecodable text, invalid JSON or JSON
    nested too deeply for the parser (all 400 ``invalid_json``), never a server error.
    """
    data = await read_within(timeout_s, request.read() if max_bytes is None else _read_at_most(request, max_bytes))
    charset = request.charset or "utf-8"
    if len(data) > OFF_LOOP_BYTES:  # megabytes of base64 audio (the Nano-vLLM API) would stall every stream
        return await asyncio.to_thread(_parse_json, data, charset)
    return _parse_json(data, charset)


OFF_LOOP_BYTES = 256 * 1024
"""A body larger than this is decoded and parsed on a worker thread, not on the event loop."""


def _parse_json(data: bytes, charset: str) -> object:
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


async def read_within(timeout_s: float, read: Awaitable[T]) -> T:
    """Await a body read, refusing a client too slow to send it (408 ``body_timeout``)."""
    try:
        return await within(read, timeout_s)
    except asyncio.TimeoutError as exc:  # not the builtin before Python 3.11
        message = f"the request body did not arrive within {timeout_s:g} s"
        raise ApiError(ErrorCode.BODY_TIMEOUT, message, close_connection=True) from exc


def speech_body_limit(config: ServerConfig) -> int:
    """A speech body's bytes (``/v1/audio/speech``, ElevenLabs' text-to-speech): its texts (``input`` or ``text``,
    ``instructions``, ``ref_text``: 4 bytes a character of UTF-8), a ``ref_audio`` clip of the upload limit as
    base64, and room for the other fields (413 beyond it)."""
    texts = (
        config.limits.max_text_chars_per_utterance
        + config.limits.max_text_chars_per_message
        + config.voices.max_transcript_chars
    )
    inline_clip = 4 * math.ceil(config.voices.max_upload_bytes / 3)
    return _UTF8_BYTES_PER_CHAR * texts + inline_clip + _OTHER_FIELDS_BYTES


_UTF8_BYTES_PER_CHAR = 4
_OTHER_FIELDS_BYTES = 64 * 1024
"""Room for the JSON around the texts and the clip, and the short fields (as the application's body limit has)."""
