"""Voice clips have a cost bound (issue 20, item 4): a clip of an absurd rate or channel count is refused from its
header, and at most ``max_voice_jobs`` clips (uploads, ``/encode_latents``, ``/generate``'s wav prompts) are decoded
and encoded at once; more get 503 ``busy`` with ``Retry-After`` instead of queueing CPU work in front of the
streams."""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time

import numpy as np
import pytest
import soundfile
from aiohttp.test_utils import TestClient
from tests.serving.helpers import clip, form, upload

import voxwire.audio.clip as clip_decoding

from .conftest import Serve

pytestmark = pytest.mark.asyncio


class HeldDecode:
    """The clip decoder, patched: the first clip's decode waits for ``release``, holding its voice-jobs slot;
    ``decodes`` counts every clip decoded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.decodes = 0
        self.decoding = threading.Event()
        self.release = threading.Event()
        real_decode = clip_decoding._decode_file

        def decode(*args: object, **kwargs: object) -> np.ndarray:
            self.decodes += 1
            if self.decodes == 1:
                self.decoding.set()
                self.release.wait(30)
            return real_decode(*args, **kwargs)

        monkeypatch.setattr(clip_decoding, "_decode_file", decode)

    async def started(self) -> None:
        """Until the first clip's decode has begun (its slot is taken)."""
        await asyncio.to_thread(self.decoding.wait, 30)


async def test_a_flac_at_655350_hz_is_refused_before_decoding(serve: Serve, aiohttp_client) -> None:
    client: TestClient = await aiohttp_client(await serve())
    data = io.BytesIO()
    soundfile.write(data, np.zeros((655_350 * 2, 2), dtype=np.float32), 655_350, format="FLAC")
    started = time.perf_counter()
    status, body = await upload(client, data.getvalue())
    assert (status, body["error"]["code"]) == (400, "invalid_audio")
    assert "655350 Hz" in body["error"]["message"]
    assert time.perf_counter() - started < 1.0  # refused from the header: nothing was decoded


async def test_uploads_beyond_max_voice_jobs_are_busy_with_retry_after(
    serve: Serve, aiohttp_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    client: TestClient = await aiohttp_client(await serve(max_voice_jobs=1))
    held = HeldDecode(monkeypatch)
    first = asyncio.create_task(upload(client, clip()))
    await held.started()
    async with client.post("/v1/voices", data=form(clip())) as second:
        assert second.status == 503
        assert (await second.json())["error"]["code"] == "busy"
        assert second.headers["Retry-After"] == "1"
    held.release.set()
    status, body = await first
    assert status == 201, body
    assert (await upload(client, clip()))[0] == 201  # the slot is free again


async def test_encode_latents_and_generate_wav_prompts_take_the_same_slot_before_decoding(
    serve: Serve, aiohttp_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/encode_latents`` and ``/generate``'s ``prompt_wav_base64``/``ref_audio_wav_base64`` once decoded and
    encoded their clips outside ``max_voice_jobs`` (security probe 4, N4r: 8 of 8 ran at once, and a bystander's
    median latency went from 24 to 243 ms): with the one slot held by an upload, they are refused, undecoded."""
    client: TestClient = await aiohttp_client(await serve(max_voice_jobs=1))
    held = HeldDecode(monkeypatch)
    first = asyncio.create_task(upload(client, clip()))
    await held.started()
    wav = base64.b64encode(clip()).decode("ascii")
    text = {"target_text": "Hello.", "response_format": "pcm"}
    refused = [
        ("/encode_latents", {"wav_base64": wav, "wav_format": "wav"}),
        ("/generate", {**text, "prompt_wav_base64": wav, "prompt_wav_format": "wav", "prompt_text": "Hi."}),
        ("/generate", {**text, "ref_audio_wav_base64": wav, "ref_audio_wav_format": "wav"}),
    ]
    for path, body in refused:
        async with client.post(path, json=body) as response:
            assert response.status == 503, (path, await response.text())
            assert response.headers["Retry-After"] == "1"
            assert "retry shortly" in (await response.json())["detail"]
    assert held.decodes == 1  # refused before their clips were decoded
    held.release.set()
    assert (await first)[0] == 201
    async with client.post("/encode_latents", json=refused[0][1]) as response:
        assert response.status == 200  # the slot is free again
