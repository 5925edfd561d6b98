"""Pipecat's ``ElevenLabsHttpTTSService`` and LiveKit's ``elevenlabs.TTS`` (``synthesize()``, ``list_voices()``), as
installed from PyPI, against our ElevenLabs HTTP routes with only their URL changed (and the voice named
``default``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import numpy as np
import pytest
from livekit.agents import APIConnectOptions
from livekit.agents.utils import http_context
from livekit.plugins import elevenlabs as livekit_elevenlabs
from pipecat.frames.frames import (
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.elevenlabs.tts import ElevenLabsHttpTTSService
from pipecat.tests.utils import QueuedFrameProcessor
from tests.serving.integrations.pipelines import PipelineBot, running_pipeline

pytestmark = pytest.mark.asyncio

TIMEOUT_S = 60.0
KEY = "sk-test"
SPOKEN = "Hello there. This is a test."


@asynccontextmanager
async def pipecat_http_bot(base_url: str, rate: int) -> AsyncIterator[PipelineBot]:
    received: asyncio.Queue[Frame] = asyncio.Queue()
    sink = QueuedFrameProcessor(queue=received, queue_direction=FrameDirection.DOWNSTREAM)
    async with aiohttp.ClientSession() as session:
        settings = ElevenLabsHttpTTSService.Settings(voice="default")
        tts = ElevenLabsHttpTTSService(api_key=KEY, aiohttp_session=session, base_url=base_url, settings=settings)
        async with running_pipeline([tts, sink], rate) as worker:
            yield PipelineBot(worker, received)


async def test_pipecat_http_service_speaks_a_turn_with_word_timestamps(serve) -> None:
    server = await serve(api_keys=(KEY,))
    async with pipecat_http_bot(str(server.make_url("/")).rstrip("/"), 16000) as bot:
        tokens = ("The first ", "sentence is ", "here. ", "The", " second one ", "ends now.")
        await bot.say(LLMFullResponseStartFrame(), *map(LLMTextFrame, tokens), LLMFullResponseEndFrame())
        await bot.next_of(TTSStoppedFrame)
        await asyncio.sleep(0.5)  # the word frames follow their audio
    frames = bot.drain()
    audio = [frame for frame in frames if isinstance(frame, TTSAudioRawFrame)]
    assert audio and {(frame.sample_rate, frame.num_channels) for frame in audio} == {(16000, 1)}
    samples = np.concatenate([np.frombuffer(frame.audio, dtype="<i2") for frame in audio])
    assert np.abs(samples).max() > 0
    words = [frame for frame in frames if isinstance(frame, TTSTextFrame)]
    assert " ".join(frame.text for frame in words) == "The first sentence is here. The second one ends now."
    times = [frame.pts for frame in words]
    assert times == sorted(times)


@asynccontextmanager
async def livekit_tts(server: object, **options: object) -> AsyncIterator[livekit_elevenlabs.TTS]:
    """The plugin as an agent job has it (outside a job, LiveKit's docs say to open the HTTP context)."""
    base_url = str(server.make_url("/v1"))  # type: ignore[attr-defined]
    async with http_context.open():
        tts = livekit_elevenlabs.TTS(base_url=base_url, api_key=KEY, voice_id="default", **options)  # type: ignore[arg-type]
        try:
            yield tts
        finally:
            await tts.aclose()


async def test_livekit_synthesize_speaks_pcm(serve) -> None:
    server = await serve(api_keys=(KEY,))
    async with livekit_tts(server, encoding="pcm_24000") as tts:
        events = [event async for event in tts.synthesize(SPOKEN, conn_options=APIConnectOptions(timeout=TIMEOUT_S))]
    assert {event.frame.sample_rate for event in events} == {24000}
    samples = np.concatenate([np.frombuffer(event.frame.data, dtype=np.int16) for event in events])
    assert samples.size > 0 and np.abs(samples).max() > 0


async def test_livekit_synthesize_decodes_its_default_mp3(serve) -> None:
    server = await serve(api_keys=(KEY,))
    async with livekit_tts(server) as tts:  # mp3_22050_32, decoded by LiveKit itself
        events = [event async for event in tts.synthesize(SPOKEN, conn_options=APIConnectOptions(timeout=TIMEOUT_S))]
    assert {event.frame.sample_rate for event in events} == {22050}
    assert sum(event.frame.samples_per_channel for event in events) > 0


async def test_livekit_lists_the_voices(serve) -> None:
    server = await serve(api_keys=(KEY,))
    async with livekit_tts(server) as tts:
        voices = await tts.list_voices()
    assert [(voice.id, voice.category) for voice in voices][:2] == [("default", "premade"), ("alloy", "premade")]
