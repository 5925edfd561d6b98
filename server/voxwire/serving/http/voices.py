"""Voices over HTTP: ``POST /v1/voices`` (multipart upload, encoded once), list, delete; ``GET /v1/audio/voices``;
ElevenLabs' ``GET /v1/voices/{voice_id}`` and ``GET /v2/voices``.

Both listings start with the built-in voices, which every request may name without an upload, marked ``"builtin":
true``: ``default`` (the model's own voice) and OpenAI's voice names, each a designed voice on a model with voice
design (its ``description``, ``serving/speech/voice_design.py``) and the model's own voice elsewhere. Every entry has
a ``description`` (null but for a designed voice). In ``GET /v1/voices`` the built-in voices have the fields of a
saved voice (no clip: ``transcript`` null, ``duration_s`` and ``created_at`` 0), so its clients read both alike; ``GET
/v1/audio/voices`` is the shape voice pickers of OpenAI-compatible servers read (Open WebUI: ``{"voices": [{"id",
"name"}]}``).

``GET /v1/voices`` serves ElevenLabs' clients from the same body: beside our ``data`` list it has ElevenLabs'
``voices`` list (``voice_id``, ``name``, ``category``: ``premade`` for a built-in voice, ``cloned`` for a saved one,
``description``, ``labels``), which its SDK's ``voices.get_all()`` and LiveKit's ``list_voices()`` read, so one
listing answers both without telling the clients apart. ``GET /v1/voices/{voice_id}`` is one such entry (the path's
id read through the aliases, ``--voice-alias``), ``GET /v2/voices`` a page of them (``page_size``,
``next_page_token``, ``search`` in the names; ElevenLabs' other filters are accepted and ignored).

Cheap checks come first: sizes while the body is read, the text fields, then the clip's header (its
duration) before it is decoded; the ``VoiceStore`` keeps the result.
"""

from __future__ import annotations

import re
import unicodedata

from aiohttp import BodyPartReader, MultipartReader, web

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.admission import require_accepting
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.http.body import read_within
from voxwire.serving.http.clips import encode_voice_clip
from voxwire.serving.http.request_models import VOICE_UPLOAD, JsonType, RequestModel, resolve
from voxwire.serving.runtime.keys import CONFIG_KEY, OWNER_KEY, SPEAKER_KEY, VOICES_KEY
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.voice_design import OPENAI_VOICE_DESIGNS
from voxwire.serving.speech.voice_store import OPENAI_VOICES, VoiceInfo
from voxwire.speech_model import ModelInfo


async def create_voice(request: web.Request) -> web.Response:
    """``POST /v1/voices`` (multipart: ``file``, optional ``transcript`` and ``name``): encode once, save."""
    fields = await read_voice_form(request, VOICE_UPLOAD)
    info = await save_voice(request, fields, VOICE_UPLOAD, clip_part="file", transcript_part="transcript")
    return web.json_response(info.to_json(), status=201)


async def read_voice_form(request: web.Request, form: RequestModel) -> dict[str, bytes]:
    """The parts of a voice upload shaped by ``form`` (``VOICE_UPLOAD``, or another API's names for them), read
    within the upload's size and time limits: refused while it is read, before anything is decoded."""
    require_accepting(request.app)  # encoding shares the model with the engine: not during warm-up or shutdown
    config = request.app[CONFIG_KEY]
    if request.content_length is not None and request.content_length > config.voices.max_upload_bytes:
        raise _too_large(config.voices.max_upload_bytes)
    return await read_within(config.limits.body_timeout_s, _read_upload(request, config, form))


async def save_voice(
    request: web.Request, fields: dict[str, bytes], form: RequestModel, *, clip_part: str, transcript_part: str
) -> VoiceInfo:
    """Encode the clip of an upload's ``fields`` (``read_voice_form``) once and save it: the text parts first, then
    the clip's header (its duration) before it is decoded, and the decoded audio and its latents must be finite
    before the voice is kept."""
    app = request.app
    config, service = app[CONFIG_KEY], app[SPEAKER_KEY]
    clip = fields.get(clip_part)
    if clip is None:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"the upload needs a '{clip_part}' part holding the voice clip")
    # An empty transcript field is the same as none (forms send empty fields).
    text = _text_part(fields, transcript_part, config, form) or None
    name = _text_part(fields, "name", config, form)
    check_voice_name(name)
    if text is None and not service.info.reference_cloning:
        message = f"this model clones a voice from a clip and its '{transcript_part}'"
        raise ApiError(ErrorCode.TRANSCRIPT_REQUIRED, message)
    # With a transcript the clip is a continuation prompt, without one a reference clip (isolated cloning).
    encoded = await encode_voice_clip(app, clip, text)
    owner = request.get(OWNER_KEY)
    return await app[VOICES_KEY].add(encoded.prompt, name=name or None, duration_s=encoded.duration_s, owner=owner)


def check_voice_name(name: str | None) -> None:
    """Refuse control and format characters (newlines, escapes, bidirectional overrides) in a voice's name:
    it is shown in listings and UIs, where they could forge lines or reorder text."""
    if name and any(unicodedata.category(char) in _CONTROL_CATEGORIES for char in name):
        raise ApiError(ErrorCode.INVALID_NAME, "a voice name may not contain control or formatting characters")


_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def _text_part(fields: dict[str, bytes], part: str, config: ServerConfig, form: RequestModel) -> str:
    """A text form part, stripped ("" when absent); UTF-8, within ``form``'s rules for it."""
    data = fields.get(part)
    if data is None:
        return ""
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'{part}' is not UTF-8 text") from exc
    return form.parse_field(part, text, config) if text else text


BUILTIN_VOICES = ("default", *sorted(OPENAI_VOICES))
"""The voices a request may name without an upload, in listing order."""


def builtin_description(info: ModelInfo, name: str) -> str | None:
    """What a built-in voice designs on this model (``OPENAI_VOICE_DESIGNS``); None: the model's own voice."""
    return OPENAI_VOICE_DESIGNS.get(name) if info.voice_design else None


async def list_voices(request: web.Request) -> web.Response:
    """``GET /v1/voices``: the built-in voices, then the saved ones (oldest first), in our shape (``data``) and in
    ElevenLabs' (``voices``)."""
    store, info = request.app[VOICES_KEY], request.app[SPEAKER_KEY].info
    listed = [
        {**VoiceInfo(name, name, None, store.model, 0.0, 0).to_json(), "builtin": True,
         "description": builtin_description(info, name)}
        for name in BUILTIN_VOICES
    ]  # fmt: skip
    listed += [{**saved.to_json(), "builtin": False, "description": None} for saved in store.infos()]
    return web.json_response({"object": "list", "data": listed, "voices": _elevenlabs_voices(request.app)})


def _elevenlabs_voices(app: web.Application) -> list[dict[str, object]]:
    """Every voice a request may name, as ElevenLabs' ``Voice`` objects."""
    info = app[SPEAKER_KEY].info
    voices = [_elevenlabs_voice(name, name, "premade", builtin_description(info, name)) for name in BUILTIN_VOICES]
    return voices + [
        _elevenlabs_voice(saved.id, saved.name, "cloned", None, saved.created_at) for saved in app[VOICES_KEY].infos()
    ]


def _elevenlabs_voice(
    voice_id: str, name: str, category: str, description: str | None, created_at: int | None = None
) -> dict[str, object]:
    return {
        "voice_id": voice_id, "name": name, "category": category, "description": description, "labels": {},
        "preview_url": None, "created_at_unix": created_at,
    }  # fmt: skip


async def get_voice(request: web.Request) -> web.Response:
    """ElevenLabs' ``GET /v1/voices/{voice_id}``: one voice (an alias's voice for an alias; 404 ``unknown_voice``)."""
    store, asked = request.app[VOICES_KEY], request.match_info["voice_id"]
    store.resolve(asked)  # UnknownVoiceError: 404
    ours = store.canonical(asked) or asked
    listed_id = ours.lower() if ours.lower() in BUILTIN_VOICES else ours  # built-in names are matched ignoring case
    return web.json_response(next(voice for voice in _elevenlabs_voices(request.app) if voice["voice_id"] == listed_id))


_DIGITS = re.compile(r"[0-9]{1,9}")
"""An integer query parameter: ASCII digits (``str.isdigit`` takes other scripts' too), few enough for any page."""

V2_MAX_PAGE_SIZE = 100
"""ElevenLabs' bound on ``GET /v2/voices``' ``page_size``."""
V2_DEFAULT_PAGE_SIZE = 10


async def search_voices(request: web.Request) -> web.Response:
    """ElevenLabs' ``GET /v2/voices``: a page of the voices whose names contain ``search`` (ignoring case);
    ``next_page_token`` is where the next page starts."""
    query = request.query
    size = _query_int(query.get("page_size"), "page_size", V2_DEFAULT_PAGE_SIZE, 1, V2_MAX_PAGE_SIZE)
    start = _query_int(query.get("next_page_token"), "next_page_token", 0, 0, None)
    search = query.get("search", "").casefold()
    found = [voice for voice in _elevenlabs_voices(request.app) if search in str(voice["name"]).casefold()]
    page, more = found[start : start + size], start + size < len(found)
    return web.json_response(
        {"voices": page, "has_more": more, "total_count": len(found), "next_page_token": str(start + size) if more
         else None}
    )  # fmt: skip


def _query_int(text: str | None, name: str, default: int, low: int, high: int | None) -> int:
    """An integer query parameter within [low, high]; 400 ``invalid_parameter`` otherwise."""
    if text is None:
        return default
    bounds = f"an integer from {low}" + ("" if high is None else f" to {high}")
    if _DIGITS.fullmatch(text) is None or int(text) < low or (high is not None and int(text) > high):
        raise ApiError(ErrorCode.INVALID_PARAMETER, f"{name} is {text!r}; it must be {bounds}")
    return int(text)


async def list_audio_voices(request: web.Request) -> web.Response:
    """``GET /v1/audio/voices``: every voice a request may name, ``{"voices": [{id, name, builtin, description}]}``."""
    info = request.app[SPEAKER_KEY].info
    voices = [
        {"id": name, "name": name, "builtin": True, "description": builtin_description(info, name)}
        for name in BUILTIN_VOICES
    ]
    voices += [
        {"id": saved.id, "name": saved.name, "builtin": False, "description": None}
        for saved in request.app[VOICES_KEY].infos()
    ]
    return web.json_response({"voices": voices})


async def delete_voice(request: web.Request) -> web.Response:
    voice_id = await remove_voice(request)
    # ElevenLabs' SDK (voices.delete) reads "status"; ours the rest.
    return web.json_response({"id": voice_id, "object": "voice", "deleted": True, "status": "ok"})


async def remove_voice(request: web.Request) -> str:
    """Delete the saved voice the path's ``voice_id`` names (only with the key that made it); its id."""
    voice_id = request.match_info["voice_id"]
    if voice_id.lower() in BUILTIN_VOICES:  # listed with the saved ones, but no upload to delete
        raise ApiError(ErrorCode.FORBIDDEN, f"{voice_id!r} is a built-in voice; only saved voices can be deleted")
    await request.app[VOICES_KEY].delete(voice_id, owner=request.get(OWNER_KEY))
    return voice_id


_UTF8_BYTES_PER_CHAR = 4


async def _read_upload(request: web.Request, config: ServerConfig, form: RequestModel) -> dict[str, bytes]:
    """The parts of a multipart upload by name (``form``'s): at most ``max_upload_bytes`` in all, and a text part
    at most the bytes its character limit allows (so an oversized transcript is refused while it is read)."""
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError) as exc:  # aiohttp asserts on a non-multipart content type
        raise ApiError(ErrorCode.INVALID_REQUEST, "send the voice as multipart/form-data") from exc
    # A text part is refused while it is read once it holds more bytes than its characters' UTF-8 (and some
    # whitespace) can take; the file part is bounded by the upload's total.
    text_limits = {
        name: _UTF8_BYTES_PER_CHAR * int(resolve(spec.max_length, config)) + _PART_SLACK
        for name, spec in form.fields.items()
        if spec.type is JsonType.STRING and spec.max_length is not None
    }
    fields: dict[str, bytes] = {}
    total = 0
    # reader.next(), not ``async for``: aiohttp types MultipartReader's __aiter__ for its body parts only.
    while (part := await _next_part(reader)) is not None:
        name = part.name if isinstance(part, BodyPartReader) else None
        if not isinstance(part, BodyPartReader) or name is None or name not in form.fields or name in fields:
            parts = ", ".join(form.fields)
            raise ApiError(ErrorCode.INVALID_REQUEST, f"unexpected form part; the parts are {parts}")
        data = bytearray()
        while chunk := await part.read_chunk():
            total += len(chunk)
            if total > config.voices.max_upload_bytes:
                raise _too_large(config.voices.max_upload_bytes)
            data += chunk
            if len(data) > text_limits.get(name, len(data)):
                limit = resolve(form.fields[name].max_length or 0, config)
                raise ApiError(ErrorCode.TEXT_TOO_LONG, f"'{name}' is longer than the limit of {limit} characters")
        fields[name] = bytes(data)
    return fields


async def _next_part(reader: MultipartReader) -> MultipartReader | BodyPartReader | None:
    try:
        return await reader.next()
    except ValueError as exc:  # aiohttp's multipart parser: a boundary that never appears, a malformed part
        raise ApiError(ErrorCode.INVALID_REQUEST, f"the upload is not valid multipart/form-data: {exc}") from exc


_PART_SLACK = 1024
"""Bytes a text part may carry beyond its characters' UTF-8 (surrounding whitespace, stripped later)."""


def _too_large(limit: int) -> ApiError:
    return ApiError(ErrorCode.UPLOAD_TOO_LARGE, f"the upload exceeds the limit of {limit} bytes")


def add_voice_routes(app: web.Application) -> None:
    app.router.add_post("/v1/voices", create_voice)
    app.router.add_get("/v1/voices", list_voices)
    app.router.add_get("/v1/audio/voices", list_audio_voices)
    app.router.add_get("/v1/voices/{voice_id}", get_voice)
    app.router.add_delete("/v1/voices/{voice_id}", delete_voice)
    app.router.add_get("/v2/voices", search_voices)
