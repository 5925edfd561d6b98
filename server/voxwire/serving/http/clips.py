"""Voice clips that clients send, decoded and encoded under one bound: ``encode_clip``.

A clip costs CPU seconds to decode and encode (a 29 s, 192 kHz, 8-channel FLAC: 2.4-3.8 s), taken from the
streams. Uploads (``POST /v1/voices``, ``/v1/audio/voices``), ``/v1/audio/speech``'s ``ref_audio``,
``/encode_latents`` and ``/generate``'s wav prompts all go through ``encode_clip``, which takes one of
``max_voice_jobs`` slots (``ServerState.voice_jobs``) before decoding anything and refuses 503 ``busy`` with
``Retry-After`` when none is free.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import hdrs, web

from voxwire.audio.clip import ClipTooLongError, load_clip
from voxwire.errors import InvalidInputError
from voxwire.prompt import VoicePrompt
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import RETRY_AFTER_S, ApiError
from voxwire.serving.runtime.keys import CONFIG_KEY, SPEAKER_KEY, STATE_KEY
from voxwire.voice_clip import VoiceClip


@dataclass(frozen=True)
class EncodedClip:
    """A clip as the service encoded it, and how long it lasted."""

    prompt: VoicePrompt
    duration_s: float
    """The decoded clip's duration."""


async def encode_clip(app: web.Application, clip: bytes, transcript: str | None) -> EncodedClip:
    """``clip`` (the bytes of an audio file) decoded off the event loop and encoded by the service, within a
    voice-job slot: with its ``transcript``, a continuation prompt; without (None), a reference clip (isolated
    cloning). Raises ``ApiError`` ``busy`` when every slot is taken (before decoding), ``ClipTooLongError`` and
    ``InvalidInputError`` for a clip the decoder or the encoder refuses (each route words its own)."""
    config, service, state = app[CONFIG_KEY], app[SPEAKER_KEY], app[STATE_KEY]
    limit = config.voices.max_voice_jobs
    if state.voice_jobs >= limit:
        message = f"{limit} voice clips are being decoded and encoded here; retry shortly"
        raise ApiError(ErrorCode.BUSY, message, headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_S)})
    rate = service.info.sample_rate
    with state.voice_job():
        samples = await asyncio.to_thread(load_clip, clip, rate, max_seconds=config.voices.max_clip_seconds)
        made_of = (
            VoiceClip(reference_audio=samples, reference_sample_rate=rate)
            if transcript is None
            else VoiceClip(transcript, samples, rate)
        )
        prompt = await service.encode_voice(made_of)
    return EncodedClip(prompt, samples.size / rate)


async def encode_voice_clip(app: web.Application, clip: bytes, transcript: str | None) -> EncodedClip:
    """``encode_clip`` for a clip that becomes a voice (an upload, a request's ``ref_audio``): a clip the decoder or
    the encoder refuses is ``clip_too_long`` or ``invalid_audio``."""
    try:
        return await encode_clip(app, clip, transcript)
    except ClipTooLongError as exc:
        raise ApiError(ErrorCode.CLIP_TOO_LONG, str(exc)) from exc
    except InvalidInputError as exc:
        raise ApiError(ErrorCode.INVALID_AUDIO, f"the voice clip is not usable audio: {exc}") from exc
