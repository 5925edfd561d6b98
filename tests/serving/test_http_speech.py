"""``POST /v1/audio/speech``: OpenAI-compatible requests, streamed bodies in every format, typed refusals."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile
from aiohttp.test_utils import TestClient

from voxstream.engine import SynthesisParams
from voxstream.serving.keys import SERVICE_KEY

pytestmark = pytest.mark.asyncio

TEXT = "Hello from the test."


async def speech(client: TestClient, **fields: object) -> tuple[int, str, bytes]:
    """Status, content type and body of a speech request (fields override a valid default body)."""
    body = {"model": "tts-1", "input": TEXT, "voice": "alloy", "seed": 3, **fields}
    async with client.post("/v1/audio/speech", json=body) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.read()


async def error_code(client: TestClient, status: int, **fields: object) -> str:
    got, content_type, body = await speech(client, **fields)
    assert got == status, body
    assert content_type.startswith("application/json")
    return json.loads(body)["error"]["code"]


async def test_wav_streams_as_a_chunked_body_readable_by_soundfile(client: TestClient) -> None:
    body = {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "wav", "seed": 3}
    async with client.post("/v1/audio/speech", json=body) as response:
        assert response.status == 200
        assert response.headers["Transfer-Encoding"] == "chunked"
        assert response.headers["Content-Type"] == "audio/wav"
        blocks = [block async for block in response.content.iter_any()]
    audio, rate = soundfile.read(io.BytesIO(b"".join(blocks)), dtype="float32")
    info = client.server.app[SERVICE_KEY].info
    assert rate == info.sample_rate
    assert audio.size > 0 and audio.size % info.samples_per_patch == 0


async def test_formats_agree_on_the_audio_of_one_seed(client: TestClient, tmp_path: Path) -> None:
    info = client.server.app[SERVICE_KEY].info
    _, _, wav = await speech(client, response_format="wav")
    reference, _ = soundfile.read(io.BytesIO(wav), dtype="float32")
    patches = reference.size // info.samples_per_patch

    _, content_type, pcm = await speech(client, response_format="pcm")
    assert content_type.startswith("audio/pcm")
    # OpenAI's pcm: 24 kHz s16le mono, so the patch count at 24 kHz, give or take the resampler's edge.
    expected = patches * info.samples_per_patch * 24000 // info.sample_rate
    assert len(pcm) % 2 == 0
    assert abs(len(pcm) // 2 - expected) <= 2, (len(pcm) // 2, expected)
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    assert np.abs(samples).max() > 0

    _, _, flac = await speech(client, response_format="flac")
    decoded, rate = soundfile.read(io.BytesIO(flac), dtype="float32")
    assert rate == info.sample_rate
    np.testing.assert_allclose(decoded, reference, atol=1 / 32768)  # both are the same s16 samples

    _, content_type, ogg = await speech(client, response_format="opus")
    assert content_type.startswith("audio/ogg")
    path = tmp_path / "speech.opus"
    path.write_bytes(ogg)
    subprocess.run(["opusinfo", str(path)], check=True, capture_output=True)
    decoded_opus = _ffmpeg_decode(path)
    assert abs(decoded_opus.size / 48000 - reference.size / info.sample_rate) < 0.03


def _ffmpeg_decode(path: Path) -> np.ndarray:
    command = ["ffmpeg", "-v", "error", "-i", str(path), "-f", "f32le", "-ac", "1", "-ar", "48000", "-"]
    result = subprocess.run(command, check=True, capture_output=True)
    return np.frombuffer(result.stdout, dtype="<f4")


async def test_the_openai_sdk_streams_pcm_and_sees_typed_errors(client: TestClient) -> None:
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    async with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="nova", input=TEXT, response_format="pcm"
    ) as response:
        pcm = b"".join([block async for block in response.iter_bytes()])
    assert len(pcm) > 0 and len(pcm) % 2 == 0
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="mp3")
    assert refused.value.code == "unsupported_format"
    await sdk.close()


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        pytest.param({"response_format": "mp3"}, "unsupported_format", id="mp3"),
        pytest.param({"response_format": "aac"}, "unsupported_format", id="aac"),
        pytest.param({"speed": 1.5}, "unsupported_speed", id="speed"),
        pytest.param({"instructions": "whisper"}, "unsupported_instructions", id="instructions"),
        pytest.param({"stream_format": "sse"}, "unsupported_stream_format", id="sse"),
        pytest.param({"input": ""}, "empty_input", id="empty-input"),
        pytest.param({"input": "   "}, "empty_input", id="blank-input"),
        pytest.param({"input": 42}, "invalid_request", id="input-not-a-string"),
        pytest.param({"voice": ["alloy"]}, "invalid_request", id="voice-not-a-string"),
        pytest.param({"speed": "fast"}, "invalid_request", id="speed-not-a-number"),
        pytest.param({"speed": True}, "invalid_request", id="speed-bool"),
        pytest.param({"temperature": 0.7}, "unknown_field", id="unknown-field"),
        pytest.param({"seed": "abc"}, "invalid_parameter", id="seed-not-an-int"),
        pytest.param({"seed": -1}, "invalid_parameter", id="seed-negative"),
        pytest.param({"inference_timesteps": 0}, "invalid_parameter", id="timesteps-zero"),
        pytest.param({"inference_timesteps": 10_000}, "invalid_parameter", id="timesteps-over-limit"),
        pytest.param({"cfg_value": 99.0}, "invalid_parameter", id="cfg-over-limit"),
    ],
)
async def test_bad_requests_get_400_with_a_stable_code(client: TestClient, fields: dict, code: str) -> None:
    assert await error_code(client, 400, **fields) == code


async def test_unknown_voice_and_malformed_bodies(client: TestClient) -> None:
    assert await error_code(client, 404, voice="voice_0123456789abcdef") == "unknown_voice"
    assert await error_code(client, 404, voice="../../etc/passwd") == "unknown_voice"
    for raw in (b"{not json", b"[1, 2]", b'"text"'):
        async with client.post("/v1/audio/speech", data=raw, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] in ("invalid_json", "invalid_request")
    async with client.get("/v1/audio/speech") as r:
        assert r.status == 405
        assert (await r.json())["error"]["code"] == "method_not_allowed"
    async with client.get("/no/such/path") as r:
        assert r.status == 404
        assert (await r.json())["error"]["code"] == "not_found"
    status, _, _ = await speech(client)
    assert status == 200  # none of it hurt the server


async def test_text_over_the_limit_is_refused(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve(max_text_chars_per_utterance=10))
    assert await error_code(client, 400, input="x" * 11) == "text_too_long"


async def test_a_full_queue_is_503_busy(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve(max_sessions=1, max_waiting=1))
    service = client.server.app[SERVICE_KEY]
    long = SynthesisParams(min_len=10_000, max_len=10_000)  # keeps its slot until aborted
    running = service.speak("hold-slot", TEXT, long)
    await anext(running)  # admitted: it holds the only slot
    waiting = service.speak("hold-queue", TEXT, long)
    queued = asyncio.ensure_future(anext(waiting))  # submitted before the HTTP request
    try:
        async with client.post("/v1/audio/speech", json={"model": "m", "input": TEXT}) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
            assert (await response.json())["error"]["code"] == "busy"
    finally:
        await running.aclose()
        await queued
        await waiting.aclose()
    status, _, _ = await speech(client)
    assert status == 200
