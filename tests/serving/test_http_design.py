"""``POST /v1/audio/speech`` with OpenAI's ``instructions`` (VoxCPM2's voice design) and ``speed``, through the
OpenAI SDK as its docs use it (only ``base_url`` changed), the audio decoded and checked."""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile
from aiohttp.test_utils import TestClient
from tests.serving.helpers import clip, record_engine_jobs, upload

import voxwire
from voxwire.engine import SynthesisParams
from voxwire.serving.app import make_app
from voxwire.serving.runtime.keys import CONFIG_KEY
from voxwire.serving.speech.voice_design import OPENAI_VOICE_DESIGNS
from voxwire.speech_model import VoxCPMSpeech
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM

from .conftest import _config

pytestmark = pytest.mark.asyncio

TEXT = "Thanks for calling. How can I help?"
CHEERFUL = "Speak in a cheerful and positive tone."
DOCS = Path(__file__).resolve().parents[2] / "docs"


def sdk(client: TestClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)


async def wav(client: TestClient, **fields: object) -> tuple[np.ndarray, int]:
    """The decoded wav of an SDK request (``seed`` 7 and ``extra_body`` fields through ``extra_body``)."""
    extra = {"seed": 7, **fields.pop("extra_body", {})}  # type: ignore[dict-item]
    api = sdk(client)
    async with api.audio.speech.with_streaming_response.create(
        model="tts-1", input=fields.pop("input", TEXT), response_format="wav", extra_body=extra, **fields
    ) as response:
        body = b"".join([block async for block in response.iter_bytes()])
    await api.close()
    audio, rate = soundfile.read(io.BytesIO(body), dtype="int16")
    return audio, rate


async def test_openais_guide_example_speaks_the_designed_text(
    client: TestClient, tiny_tts: VoxCPM, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    audio, rate = await wav(client, voice="coral", instructions=CHEERFUL)
    control = f"{OPENAI_VOICE_DESIGNS['coral']}; Speak in a cheerful and positive tone"
    assert [job.text for job in jobs] == [f"({control}){TEXT}"]
    assert rate == tiny_tts.sample_rate and audio.size > 0 and audio.size % tiny_tts.samples_per_patch == 0
    # The same as the model's own generate of that text for the same seed (test_reference_parity holds generate to
    # the reference's for a designed text).
    expected = tiny_tts.generate(f"({control}){TEXT}", SynthesisParams(seed=7))
    expected_s16 = np.rint(np.clip(expected, -1, 1) * 32767).astype(np.int16)
    assert audio.shape == expected_s16.shape
    assert np.abs(audio.astype(np.int32) - expected_s16).max() <= 1


async def test_instructions_alone_design_the_default_voice_and_are_cleaned(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    await wav(client, voice="default", instructions="  A deep (very deep)\n voice  ")
    await wav(client, voice="default", instructions="   ")
    assert [job.text for job in jobs] == [f"(A deep very deep voice){TEXT}", TEXT]


@pytest.mark.isa
async def test_voice_names_are_distinct_designs_fixed_by_the_seed(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    onyx, _ = await wav(client, voice="onyx")
    again, _ = await wav(client, voice="ONYX")
    nova, _ = await wav(client, voice="nova")
    assert np.array_equal(onyx, again), "the same name and seed: the same voice"
    assert onyx.shape != nova.shape or not np.array_equal(onyx, nova)
    assert [job.text for job in jobs] == [f"({OPENAI_VOICE_DESIGNS[name]}){TEXT}" for name in ("onyx", "onyx", "nova")]
    assert len(set(OPENAI_VOICE_DESIGNS.values())) == 13


async def test_the_docs_show_every_voice_names_description() -> None:
    table = dict(re.findall(r"^\| `([a-z]+)` \| (.+) \|$", (DOCS / "http-api.md").read_text(), flags=re.MULTILINE))
    assert table == OPENAI_VOICE_DESIGNS


async def test_a_reference_voice_takes_instructions_a_continuation_voice_is_refused(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, reference = await upload(client, clip())
    _, continuation = await upload(client, clip(), transcript="This is my voice.")
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    audio, _ = await wav(client, voice=reference["id"], instructions="whispering")
    assert audio.size > 0
    (job,) = jobs
    assert job.text == f"(whispering){TEXT}"
    assert job.voice is not None and job.voice.reference_patches is not None and job.voice.audio_patches is None
    api = sdk(client)
    with pytest.raises(openai.BadRequestError) as refused:
        await api.audio.speech.create(model="tts-1", voice=continuation["id"], input=TEXT, instructions="whispering")
    assert refused.value.code == "unsupported"
    assert "transcript" in str(refused.value)
    # Without instructions the continuation voice speaks as before, undesigned.
    await api.audio.speech.create(model="tts-1", voice=continuation["id"], input=TEXT)
    await api.close()
    assert jobs[-1].text == TEXT


@pytest.fixture(scope="module")
def v1_tts(tmp_path_factory: pytest.TempPathFactory) -> VoxCPM:
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("v1-model") / "voxcpm", "voxcpm-16k")
    return voxwire.load_model(folder, device="cpu")


@pytest.mark.isa
async def test_a_model_without_voice_design_refuses_instructions_and_names_stay_default(
    aiohttp_server: Callable, aiohttp_client: Callable, v1_tts: VoxCPM, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .conftest import wait_ready

    app = make_app(_config(), model=VoxCPMSpeech(v1_tts))
    client = await aiohttp_client(await aiohttp_server(app))
    await wait_ready(app)
    api = sdk(client)
    with pytest.raises(openai.BadRequestError) as refused:
        await api.audio.speech.create(model="tts-1", voice="coral", input=TEXT, instructions=CHEERFUL)
    assert refused.value.code == "unsupported"
    await api.close()
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    coral, rate = await wav(client, voice="coral")
    alloy, _ = await wav(client, voice="alloy")
    assert rate == v1_tts.sample_rate
    assert np.array_equal(coral, alloy), "every name is the default voice"
    assert [job.text for job in jobs] == [TEXT, TEXT]


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
async def test_speed_scales_the_duration_and_streams(client: TestClient, speed: float) -> None:
    normal, rate = await wav(client, voice="default")
    api = sdk(client)
    async with api.audio.speech.with_streaming_response.create(
        model="tts-1", voice="default", input=TEXT, response_format="pcm", speed=speed, extra_body={"seed": 7}
    ) as response:
        assert response.headers["Content-Type"] == "audio/pcm;rate=24000;encoding=s16le"
        blocks = [block async for block in response.iter_bytes()]
    await api.close()
    pcm = np.frombuffer(b"".join(blocks), dtype="<i2")
    assert abs(pcm.size / 24000 - normal.size / rate / speed) < 0.005, (pcm.size / 24000, normal.size / rate / speed)
    assert np.abs(pcm).max() > 0


@pytest.mark.isa
async def test_speed_one_is_the_bytes_of_no_speed(client: TestClient) -> None:
    plain, _ = await wav(client, voice="default")
    same, _ = await wav(client, voice="default", speed=1.0)
    assert np.array_equal(plain, same)


async def test_instructions_and_speed_together_through_sse(client: TestClient) -> None:
    normal, rate = await wav(client, voice="sage", instructions=CHEERFUL)
    api = sdk(client)
    deltas: list[bytes] = []
    async with api.audio.speech.with_streaming_response.create(
        model="tts-1", voice="sage", input=TEXT, instructions=CHEERFUL, speed=1.5, response_format="pcm",
        stream_format="sse", extra_body={"seed": 7},
    ) as response:  # fmt: skip
        async for line in response.iter_lines():
            event = json.loads(line.removeprefix("data: ")) if line.startswith("data: ") else {}
            if event.get("type") == "speech.audio.delta":
                deltas.append(base64.b64decode(event["audio"]))
    await api.close()
    assert len(deltas) > 1, "the audio leaves in several events"
    pcm = np.frombuffer(b"".join(deltas), dtype="<i2")
    assert abs(pcm.size / 24000 - normal.size / rate / 1.5) < 0.005


@pytest.mark.parametrize("limit", [None, 64])
async def test_instructions_over_the_limit_are_a_400_before_any_work(
    serve, aiohttp_client, monkeypatch: pytest.MonkeyPatch, limit: int | None
) -> None:
    # Instructions are bounded as a WebSocket text message is: the server's limit, default or configured.
    overrides = {} if limit is None else {"max_text_chars_per_message": limit}
    client = await aiohttp_client(await serve(**overrides))
    limit = client.server.app[CONFIG_KEY].limits.max_text_chars_per_message
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    async with client.post("/v1/audio/speech", json={"input": TEXT, "instructions": "a" * (limit + 1)}) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["code"] == "text_too_long" and "instructions" in error["message"] and not jobs
    async with client.get("/openapi.json") as response:
        schema = (await response.json())["components"]["schemas"]["SpeechRequest"]
    assert schema["properties"]["instructions"]["maxLength"] == limit
    if overrides:  # at the limit: designed and spoken (4096 characters are more than the tiny model's positions)
        await wav(client, voice="default", instructions="a" * limit)
        assert [job.text for job in jobs] == [f"({'a' * limit}){TEXT}"]


@pytest.mark.parametrize("instructions", ["...", " ; ", "(.)"])
async def test_instructions_of_punctuation_alone_add_nothing_to_a_voice_names_design(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, instructions: str
) -> None:
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    await wav(client, voice="coral", instructions=instructions)
    assert [job.text for job in jobs] == [f"({OPENAI_VOICE_DESIGNS['coral']}){TEXT}"]
