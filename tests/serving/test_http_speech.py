"""``POST /v1/audio/speech``: OpenAI-compatible requests, streamed bodies in every format, typed refusals."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile
from aiohttp.test_utils import TestClient
from tests.serving.helpers import record_engine_jobs

from voxwire.engine import SynthesisParams
from voxwire.serving.runtime.keys import SPEAKER_KEY, STATE_KEY
from voxwire.serving.speech.service import SpeechJob

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
    info = client.server.app[SPEAKER_KEY].info
    assert rate == info.sample_rate
    assert audio.size > 0 and audio.size % info.samples_per_patch == 0


@pytest.mark.slow
@pytest.mark.isa
async def test_formats_agree_on_the_audio_of_one_seed(client: TestClient, tmp_path: Path) -> None:
    info = client.server.app[SPEAKER_KEY].info
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

    _, content_type, flac = await speech(client, response_format="flac")
    assert content_type == "audio/flac"
    path = tmp_path / "speech.flac"
    path.write_bytes(flac)
    # ffmpeg: a streamed FLAC's length is "unknown" in its header, which libsndfile cannot read to the end
    decoded = np.frombuffer(_ffmpeg_decode(path, "s16le", info.sample_rate), dtype="<i2")
    np.testing.assert_array_equal(decoded, np.frombuffer(wav[44:], dtype="<i2"))  # the same s16 samples

    _, content_type, ogg = await speech(client, response_format="opus")
    assert content_type.startswith("audio/ogg")
    path = tmp_path / "speech.opus"
    path.write_bytes(ogg)
    subprocess.run(["opusinfo", str(path)], check=True, capture_output=True)
    decoded_opus = np.frombuffer(_ffmpeg_decode(path, "f32le", 48000), dtype="<f4")
    assert abs(decoded_opus.size / 48000 - reference.size / info.sample_rate) < 0.03


def _ffmpeg_decode(path: Path, sample_format: str, rate: int) -> bytes:
    command = ["ffmpeg", "-v", "error", "-i", str(path), "-f", sample_format, "-ac", "1", "-ar", str(rate), "-"]
    return subprocess.run(command, check=True, capture_output=True).stdout


def _ffprobe(path: Path) -> tuple[str, float]:
    """(codec name, duration in seconds) as ffprobe reads them; the duration counts whole codec frames."""
    command = ["ffprobe", "-v", "error", "-count_packets", "-show_streams", "-show_format", "-of", "json", str(path)]
    info = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    (stream,) = info["streams"]
    if stream["codec_name"] == "aac":  # ADTS has no length, and its size says little: count the frames
        return "aac", int(stream["nb_read_packets"]) * 1024 / int(stream["sample_rate"])
    return stream["codec_name"], float(info["format"]["duration"])


async def _wav_seconds(client: TestClient) -> float:
    _, _, wav = await speech(client, response_format="wav")
    audio, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    return audio.size / rate


@pytest.mark.parametrize(
    ("response_format", "codec", "content_type"), [(None, "mp3", "audio/mpeg"), ("aac", "aac", "audio/aac")]
)
async def test_the_openai_sdk_gets_mp3_by_default_and_aac_on_request(
    client: TestClient, tmp_path: Path, response_format: str | None, codec: str, content_type: str
) -> None:
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    chosen = {} if response_format is None else {"response_format": response_format}
    async with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, extra_body={"seed": 3}, **chosen
    ) as response:
        assert response.headers["Content-Type"] == content_type
        audio = b"".join([block async for block in response.iter_bytes()])
    await sdk.close()
    path = tmp_path / f"speech.{codec}"
    path.write_bytes(audio)
    got_codec, duration = _ffprobe(path)
    expected = await _wav_seconds(client)  # the same seed: the same speech
    assert got_codec == codec
    # The codec adds its delay and pads its last frame: a few frames (26 ms for mp3, 21 ms for aac at 48 kHz).
    assert 0 <= duration - expected < 0.15, (duration, expected)


def _sse_events(body: bytes) -> list[dict]:
    """Parse a ``text/event-stream`` body: each event is ``data: <json>`` and a blank line."""
    assert body.endswith(b"\n\n")
    events = []
    for message in body.decode().split("\n\n")[:-1]:
        (line,) = message.split("\n")
        assert line.startswith("data: ")
        events.append(json.loads(line.removeprefix("data: ")))
    return events


@pytest.mark.parametrize("response_format", ["mp3", "pcm"])
async def test_sse_events_concatenate_to_the_raw_body(client: TestClient, response_format: str) -> None:
    _, _, raw = await speech(client, response_format=response_format)
    status, content_type, body = await speech(client, response_format=response_format, stream_format="sse")
    assert status == 200 and content_type == "text/event-stream"
    *deltas, done = _sse_events(body)
    assert len(deltas) > 1, "the audio leaves in several events, as it is generated"
    assert {event["type"] for event in deltas} == {"speech.audio.delta"}
    assert b"".join(base64.b64decode(event["audio"]) for event in deltas) == raw
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_flac_first_bytes_arrive_before_the_utterance_ends(serve, aiohttp_client, slow_down) -> None:
    client = await aiohttp_client(await serve())
    app = client.server.app
    slow_down(app, 0.1)
    body = {"model": "tts-1", "input": TEXT, "response_format": "flac", "seed": 3}
    async with client.post("/v1/audio/speech", json=body) as response:
        first = await response.content.readany()
        first_at = time.perf_counter()
        assert first.startswith(b"fLaC")
        assert app[STATE_KEY].live_utterances == 1, "the header and first frames came while still speaking"
        rest = await response.read()
        waited = time.perf_counter() - first_at
    assert len(rest) > 0
    assert waited > 0.1, "at least one more step (0.1 s each) ran after the first bytes came"


async def test_the_openai_sdk_streams_pcm_and_sees_typed_errors(client: TestClient) -> None:
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    async with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="nova", input=TEXT, response_format="pcm"
    ) as response:
        pcm = b"".join([block async for block in response.iter_bytes()])
    assert len(pcm) > 0 and len(pcm) % 2 == 0
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, speed=5.0)
    assert refused.value.code == "invalid_parameter"
    await sdk.close()


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        pytest.param({"response_format": "vorbis"}, "unsupported_format", id="vorbis"),
        pytest.param({"speed": 4.5}, "invalid_parameter", id="speed-too-fast"),
        pytest.param({"speed": 0.2}, "invalid_parameter", id="speed-too-slow"),
        pytest.param({"speed": 10**400}, "invalid_parameter", id="speed-no-float-holds"),
        pytest.param({"instructions": 3}, "invalid_request", id="instructions-not-a-string"),
        pytest.param({"stream_format": "ndjson"}, "unsupported_stream_format", id="ndjson"),
        pytest.param({"input": ""}, "empty_input", id="empty-input"),
        pytest.param({"input": "   "}, "empty_input", id="blank-input"),
        pytest.param({"input": 42}, "invalid_request", id="input-not-a-string"),
        pytest.param({"voice": ["alloy"]}, "invalid_request", id="voice-not-a-string"),
        pytest.param({"speed": "fast"}, "invalid_request", id="speed-not-a-number"),
        pytest.param({"speed": True}, "invalid_request", id="speed-bool"),
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


@pytest.mark.parametrize("field", ["input", "instructions", "voice", "model"])
async def test_a_lone_surrogate_in_a_string_is_a_400_not_a_500(client: TestClient, field: str) -> None:
    # JSON may escape half of a surrogate pair ("\\ud800"); it decodes to a string no UTF-8 coder takes.
    body = {"model": "tts-1", "input": TEXT, "voice": "alloy", "instructions": "calm", "response_format": "pcm"}
    raw = json.dumps(body).replace(f'"{field}": "', f'"{field}": "\\ud800', 1).encode()
    async with client.post("/v1/audio/speech", data=raw, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400, await r.text()
        error = (await r.json())["error"]
        assert error["code"] == "invalid_request"
        assert field in error["message"]


async def test_text_over_the_limit_is_refused(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve(max_text_chars_per_utterance=10))
    assert await error_code(client, 400, input="x" * 11) == "text_too_long"


async def test_a_full_queue_is_503_busy(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve(max_sessions=1, max_waiting=1))
    service = client.server.app[SPEAKER_KEY]
    long = SynthesisParams(min_len=10_000, max_len=10_000)  # keeps its slot until aborted
    running = service.speak(SpeechJob("hold-slot", TEXT, long))
    await anext(running)  # admitted: it holds the only slot
    waiting = service.speak(SpeechJob("hold-queue", TEXT, long))
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


@pytest.mark.slow
async def test_normalize_extra_field_speaks_the_normalized_text(client: TestClient, monkeypatch) -> None:
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    audio = await sdk.audio.speech.create(
        model="tts-1", voice="default", input="It costs $12.50.", response_format="pcm", extra_body={"normalize": True}
    )
    await sdk.close()
    assert len(audio.content) > 0
    status, _, _ = await speech(client, input="It costs $12.50.", voice="default")
    assert status == 200
    assert [job.text for job in jobs] == [
        "It costs twelve dollars and fifty cents.",
        "It costs $12.50.",
    ]  # off by default
    assert await error_code(client, 400, normalize="yes") == "invalid_request"


async def test_normalize_without_the_extra_is_a_clear_400(client: TestClient, monkeypatch) -> None:
    from voxwire.serving.http import openai as http_api

    monkeypatch.setattr(http_api, "normalizer_available", lambda: False)
    status, _, body = await speech(client, normalize=True)
    assert status == 400
    error = json.loads(body)["error"]
    assert error["code"] == "normalize_unavailable"
    assert "pip install 'voxwire[normalize]'" in error["message"]
