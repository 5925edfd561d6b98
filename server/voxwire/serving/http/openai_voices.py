"""The OpenAI SDK's custom voices over our saved voices: ``client.audio.voices.create(...)`` is ``POST
/v1/audio/voices`` and ``client.audio.voices.delete(id)`` is ``DELETE /v1/audio/voices/{voice_id}`` (the SDK has no
list: ``GET /v1/audio/voices``, ``http/voices.py``, lists them for voice pickers).

A created voice is saved exactly as ``POST /v1/voices`` saves one (``voices.read_voice_form``, ``voices.save_voice``:
the same limits, voice-job slots and store), from the SDK's multipart parts: ``audio_sample``, ``name``,
``consent`` (not checked: this server keeps no consent recordings) and ``type`` (``audio_sample``; OpenAI's
``prompt`` voices, designed from a description, are refused ``unsupported``), and vLLM-Omni's ``ref_text`` (the
transcript) and ``speaker_description`` (not kept). It answers the SDK's ``Voice`` object; its ``id`` is what
``voice`` (or ``voice={"id": ...}``) names in a speech request.
"""

from __future__ import annotations

from aiohttp import web

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.http.request_models import OPENAI_VOICE_CREATE, OPENAI_VOICE_TYPE
from voxwire.serving.http.voices import read_voice_form, remove_voice, save_voice
from voxwire.serving.speech.voice_store import VoiceInfo

AUDIO_VOICES_PATH = "/v1/audio/voices"


async def create_audio_voice(request: web.Request) -> web.Response:
    """``POST /v1/audio/voices``: a saved voice, as the SDK's ``Voice`` (201)."""
    if request.content_type == "application/json":  # how the SDK sends a ``prompt`` voice: no clip to read
        raise ApiError(ErrorCode.UNSUPPORTED, _PROMPT_VOICES)
    fields = await read_voice_form(request, OPENAI_VOICE_CREATE)
    kind = fields.get("type", OPENAI_VOICE_TYPE.encode()).decode("utf-8", "replace").strip() or OPENAI_VOICE_TYPE
    if kind != OPENAI_VOICE_TYPE or "prompt" in fields:
        raise ApiError(ErrorCode.UNSUPPORTED, _PROMPT_VOICES)
    info = await save_voice(request, fields, OPENAI_VOICE_CREATE, clip_part="audio_sample", transcript_part="ref_text")
    return web.json_response(audio_voice(info), status=201)


_PROMPT_VOICES = (
    f"only voices from a clip are made here (type '{OPENAI_VOICE_TYPE}', with an 'audio_sample' part); a voice "
    "designed from a text prompt is not: VoxCPM2 designs a voice per request from 'instructions'"
)


def audio_voice(info: VoiceInfo) -> dict[str, object]:
    """A saved voice as the OpenAI SDK's ``Voice``."""
    return {
        "id": info.id,
        "object": "audio.voice",
        "name": info.name,
        "created_at": info.created_at,
        "type": OPENAI_VOICE_TYPE,
    }


async def delete_audio_voice(request: web.Request) -> web.Response:
    """``DELETE /v1/audio/voices/{voice_id}``: as ``DELETE /v1/voices/{voice_id}``, answered as the SDK's
    ``VoiceDeleted``."""
    voice_id = await remove_voice(request)
    return web.json_response({"id": voice_id, "object": "audio.voice.deleted", "deleted": True})


def add_openai_voice_routes(app: web.Application) -> None:
    app.router.add_post(AUDIO_VOICES_PATH, create_audio_voice)
    app.router.add_delete(AUDIO_VOICES_PATH + "/{voice_id}", delete_audio_voice)
