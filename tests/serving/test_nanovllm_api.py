"""Nano-vLLM-VoxCPM's HTTP API on ``voxwire serve``, driven by a client written from that project's documented API
(its deployment README and schemas): ``/encode_latents``, ``/generate`` (mp3 and pcm, zero-shot, prompt and
reference by wav or latents, ``lora_name``), ``/info`` and ``/loras``, with its error shapes."""

from __future__ import annotations

import base64
import io
import shutil
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import soundfile as sf
from aiohttp import web
from aiohttp.test_utils import TestClient
from safetensors.torch import load_file, save_file

from voxwire.audio.pcm import to_s16le
from voxwire.params import SynthesisParams
from voxwire.serving.runtime.keys import VOICES_KEY
from voxwire.tts import VoxCPM

from .conftest import LORA, Serve

TEXT = "Hello world."


class NanoVllmClient:
    """What a Nano-vLLM-VoxCPM client does: JSON in, streamed audio or JSON out, ``raise_for_status`` on errors."""

    def __init__(self, http: TestClient) -> None:
        self.http = http

    async def encode_latents(self, wav: bytes, wav_format: str = "wav") -> dict[str, Any]:
        body = {"wav_base64": base64.b64encode(wav).decode("utf-8"), "wav_format": wav_format}
        async with self.http.post("/encode_latents", json=body) as response:
            response.raise_for_status()
            return await response.json()

    async def generate(self, **payload: Any) -> tuple[dict[str, str], bytes]:
        async with self.http.post("/generate", json=payload) as response:
            response.raise_for_status()
            chunks = [chunk async for chunk in response.content.iter_chunked(64 * 1024)]
            return dict(response.headers), b"".join(chunks)

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.http.request(method, path, **kwargs) as response:
            return response.status, await response.json()


@pytest.fixture(scope="module")
def prompt_wav() -> bytes:
    """A one-second 16 kHz WAV file (a chord), as a client would read it from disk."""
    t = np.arange(16000) / 16000
    samples = 0.2 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 330 * t)
    buffer = io.BytesIO()
    sf.write(buffer, samples.astype(np.float32), 16000, format="WAV")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def other_lora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("nano-loras") / "b"
    shutil.copytree(LORA, folder)
    state = load_file(str(folder / "lora_weights.safetensors"))
    save_file({k: (0.5 * v).contiguous() for k, v in state.items()}, str(folder / "lora_weights.safetensors"))
    return folder


@pytest_asyncio.fixture
async def client(
    serve: Serve,
    persona_app: Callable[..., web.Application],
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    other_lora: Path,
) -> NanoVllmClient:
    app = persona_app(lora_root=other_lora.parent)
    return NanoVllmClient(await aiohttp_client(await serve(app=app)))


def pcm(audio: np.ndarray) -> bytes:
    return to_s16le(audio)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_generate_pcm_is_the_models_audio_with_its_headers(client: NanoVllmClient, persona_tts: VoxCPM) -> None:
    headers, body = await client.generate(target_text=TEXT, seed=7, response_format="pcm", max_generate_length=40)
    rate = persona_tts.sample_rate
    assert headers["Content-Type"] == f"audio/L16;rate={rate};channels=1"
    assert (headers["X-Audio-Sample-Rate"], headers["X-Audio-Channels"], headers["X-Audio-Encoding"]) == (
        str(rate), "1", "s16le",
    )  # fmt: skip
    # Its defaults: cfg_value 1.5 (not voxwire's 2.0).
    assert body == pcm(persona_tts.generate(TEXT, SynthesisParams(seed=7, cfg_value=1.5, max_len=40)))


@pytest.mark.asyncio
async def test_generate_mp3_by_default(client: NanoVllmClient) -> None:
    headers, body = await client.generate(target_text=TEXT, seed=7, cfg_value=2, max_generate_length=20)
    assert headers["Content-Type"] == "audio/mpeg" and headers["X-Audio-Encoding"] == "mp3"
    decoded, rate = sf.read(io.BytesIO(body))
    assert rate == 48000 and decoded.size > 0


@pytest.mark.asyncio
async def test_prompts_by_wav_and_by_latents_are_the_same_voice(client: NanoVllmClient, prompt_wav: bytes) -> None:
    latents = await client.encode_latents(prompt_wav)
    assert (latents["feat_dim"], latents["latents_dtype"], latents["sample_rate"], latents["channels"]) == (
        64, "float32", 48000, 1,
    )  # fmt: skip
    rows = np.frombuffer(base64.b64decode(latents["prompt_latents_base64"]), np.float32).reshape(-1, 64)
    assert rows.shape[0] > 0 and np.isfinite(rows).all()

    common = {"target_text": TEXT, "seed": 3, "response_format": "pcm", "max_generate_length": 30}
    by_wav = await client.generate(
        **common,
        prompt_wav_base64=base64.b64encode(prompt_wav).decode(),
        prompt_wav_format="wav",
        prompt_text="A chord.",
    )
    by_latents = await client.generate(
        **common, prompt_latents_base64=latents["prompt_latents_base64"], prompt_text="A chord."
    )
    zero_shot = await client.generate(**common)
    assert by_wav[1] == by_latents[1] != zero_shot[1]
    with_reference = await client.generate(**common, ref_audio_latents_base64=latents["prompt_latents_base64"])
    assert with_reference[1] != zero_shot[1]


@pytest.mark.asyncio
async def test_loras_register_list_use_and_unregister(
    client: NanoVllmClient, persona_tts: VoxCPM, other_lora: Path
) -> None:
    assert await client.request("GET", "/loras") == (200, [{"name": "A"}])
    assert await client.request("POST", "/loras", json={"name": "B", "path": str(other_lora)}) == (200, {"name": "B"})
    assert await client.request("GET", "/loras") == (200, [{"name": "A"}, {"name": "B"}])
    status, info = await client.request("GET", "/info")
    assert status == 200 and info["lora"]["registered_names"] == ["A", "B"] and info["lora"]["loaded"] is True
    assert info["model"]["sample_rate"] == persona_tts.sample_rate and info["model"]["feat_dim"] == 64
    assert info["model"]["patch_size"] == persona_tts.config.patch_size and info["mp3"]["bitrate_kbps"] == 128

    payload = {"target_text": TEXT, "seed": 5, "response_format": "pcm", "max_generate_length": 30}
    _, with_a = await client.generate(**payload, lora_name="A")
    assert with_a == pcm(persona_tts.generate(TEXT, SynthesisParams(seed=5, cfg_value=1.5, max_len=30), lora="A"))
    _, with_b = await client.generate(**payload, lora_name="B")
    assert with_b != with_a

    assert await client.request("DELETE", "/loras/B") == (200, {"name": "B"})
    status, error = await client.request("POST", "/generate", json={**payload, "lora_name": "B"})
    assert status == 400 and error["detail"] == "LoRA 'B' is not registered"
    status, error = await client.request("DELETE", "/loras/B")
    assert status == 400 and "B" in error["detail"]
    status, error = await client.request("POST", "/loras", json={"name": "C", "path": "/no/such/lora"})
    assert status == 400 and isinstance(error["detail"], str)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"target_text": TEXT, "prompt_text": "hi"}, "prompt_text is not allowed for zero-shot"),
        ({"target_text": TEXT, "prompt_latents_base64": "AAAA"}, "latents prompt requires non-empty prompt_text"),
        (
            {"target_text": TEXT, "prompt_wav_base64": "AAAA", "prompt_latents_base64": "AAAA", "prompt_text": "x"},
            "prompt_wav_* and prompt_latents_base64 are mutually exclusive",
        ),
        ({"target_text": TEXT, "prompt_wav_base64": "AAAA", "prompt_text": "x"}, "wav prompt requires"),
        ({"target_text": TEXT, "ref_audio_wav_base64": "AAAA"}, "reference wav requires"),
        ({"target_text": TEXT, "prompt_latents_base64": "!!", "prompt_text": "x"}, "Invalid base64"),
        ({"target_text": TEXT, "prompt_latents_base64": "AAAA", "prompt_text": "x"}, "Invalid latent payload"),
        ({"target_text": TEXT, "temperature": 0.5}, "temperature"),
    ],
)
@pytest.mark.asyncio
async def test_invalid_input_is_a_400_with_detail(client: NanoVllmClient, payload: dict, message: str) -> None:
    status, error = await client.request("POST", "/generate", json=payload)
    assert status == 400 and message in error["detail"]


@pytest.mark.asyncio
async def test_huge_latents_are_a_400_not_the_length_cap_of_silence(client: NanoVllmClient, prompt_wav: bytes) -> None:
    """Issue 20 (N12): latents of constant 3e38 are finite, passed the gate, and gave 200 with the length cap of
    silence; they are refused before they reach the model."""
    latents = await client.encode_latents(prompt_wav)
    rows = np.frombuffer(base64.b64decode(latents["prompt_latents_base64"]), np.float32)
    huge = base64.b64encode(np.full_like(rows, 3e38).tobytes()).decode()
    for fields in ({"prompt_latents_base64": huge, "prompt_text": "A chord."}, {"ref_audio_latents_base64": huge}):
        status, error = await client.request("POST", "/generate", json={"target_text": TEXT, **fields})
        assert status == 400 and "above 1000" in error["detail"], fields


@pytest.mark.asyncio
async def test_latents_longer_than_the_longest_clip_are_refused_before_decoding(
    client: NanoVllmClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20, item 9: latents are bounded by the longest clip (``max_clip_seconds``) on their base64 text."""
    from voxwire.serving.http import nanovllm

    app = client.http.server.app
    patch, dim = app[VOICES_KEY].patch_shape
    patches = nanovllm._max_patches(app) + 1
    rows = base64.b64encode(np.zeros((patches * patch, dim), np.float32).tobytes()).decode()
    monkeypatch.setattr(nanovllm, "_b64", lambda *args: pytest.fail("decoded before the length check"))
    payload = {"target_text": TEXT, "ref_audio_latents_base64": rows}
    status, error = await client.request("POST", "/generate", json=payload)
    assert status == 400 and "more than" in error["detail"]


@pytest.mark.asyncio
async def test_a_large_body_is_parsed_off_the_event_loop(
    client: NanoVllmClient, prompt_wav: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from voxwire.serving.http import body

    threads: list[str] = []
    parse = body._parse_json

    def recording(data: bytes, charset: str) -> object:
        threads.append(threading.current_thread().name)
        return parse(data, charset)

    monkeypatch.setattr(body, "_parse_json", recording)
    padding = base64.b64encode(bytes(body.OFF_LOOP_BYTES)).decode()
    await client.request("POST", "/generate", json={"target_text": TEXT, "prompt_text": padding})
    await client.request("POST", "/generate", json={"target_text": TEXT, "max_generate_length": 0})
    assert threads[0] != threading.main_thread().name  # the large body: a worker thread
    assert threads[1] == threading.main_thread().name  # a small one stays on the loop (no hand-off cost)


@pytest.mark.asyncio
async def test_a_body_off_the_schema_is_a_422_list(client: NanoVllmClient) -> None:
    status, error = await client.request("POST", "/generate", json={"max_generate_length": 0, "cfg_value": "x"})
    assert status == 422
    assert {tuple(item["loc"]): item["type"] for item in error["detail"]} == {
        ("body", "target_text"): "missing",
        ("body", "max_generate_length"): "greater_than_equal",
        ("body", "cfg_value"): "type",
    }
    status, error = await client.request("POST", "/generate", json={"target_text": TEXT, "response_format": "wav"})
    assert status == 422 and error["detail"][0]["type"] == "literal_error"
    headers, body = await client.generate(target_text=TEXT, extra=1, seed=1, max_generate_length=5)
    assert headers["X-Audio-Encoding"] == "mp3" and body  # unknown fields are ignored, as its schemas do
