"""``POST /v1/audio/speech``: OpenAI-compatible requests, streamed bodies in every format, typed refusals."""

from __future__ import annotations

import io

import pytest
import soundfile
from aiohttp.test_utils import TestClient

from voxstream.serving.keys import SERVICE_KEY

pytestmark = pytest.mark.asyncio

TEXT = "Hello from the test."


async def speech(client: TestClient, **body: object) -> tuple[int, str, bytes]:
    async with client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, **body}) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.read()


async def test_wav_is_streamed_chunked_and_readable(client: TestClient) -> None:
    async with client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "alloy",
                                                      "response_format": "wav", "seed": 3}) as response:
        assert response.status == 200
        assert response.headers["Transfer-Encoding"] == "chunked"
        body = await response.read()
    audio, rate = soundfile.read(io.BytesIO(body), dtype="float32")
    assert rate == client.server.app[SERVICE_KEY].info.sample_rate
    assert audio.size > 0
