"""LiveKit Agents' own OpenAI TTS plugin, with its default arguments, against our OpenAI endpoint.

Its defaults ask for mp3 and ``stream_format: "sse"`` (for every model but tts-1/tts-1-hd); the
plugin decodes the mp3 with its own decoder into 24 kHz frames.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from aiohttp.test_utils import TestClient
from livekit.plugins import openai as livekit_openai

pytestmark = pytest.mark.asyncio

TEXT = "Hello from the test."


async def test_default_plugin_synthesizes(client: TestClient) -> None:
    before = await audio_seconds(client)
    tts = livekit_openai.TTS(base_url=str(client.make_url("/v1")), api_key="unused")
    try:
        async with tts.synthesize(TEXT) as stream:
            events = [event async for event in stream]
    finally:
        await tts.aclose()
    frames = [event.frame for event in events]
    # The plugin reads the response's X-Request-Id (without one it logs "no request_id provided" and says "unknown").
    (request_id,) = {event.request_id for event in events}
    assert re.fullmatch(r"req_[0-9a-f]{24}", request_id), request_id
    samples = np.concatenate([np.frombuffer(frame.data, dtype=np.int16) for frame in frames])
    assert {frame.sample_rate for frame in frames} == {24000}
    generated_s = await audio_seconds(client) - before
    # the plugin's decoder resamples to 24 kHz; the codec adds its delay and pads its last frame
    assert abs(samples.size / 24000 - generated_s) < 0.15, (samples.size / 24000, generated_s)
    assert np.abs(samples).max() > 0


async def audio_seconds(client: TestClient) -> float:
    """The server's ``voxwire_audio_seconds_total``: the audio it generated so far."""
    async with client.get("/metrics") as response:
        text = await response.text()
    (line,) = [line for line in text.splitlines() if line.startswith("voxwire_audio_seconds_total ")]
    return float(line.split()[1])
