"""Voice uploads have a cost bound (issue 20, item 4): a clip of an absurd rate or channel count is refused from
its header, and at most ``max_voice_jobs`` uploads are decoded and encoded at once; more get 503 ``busy`` with
``Retry-After`` instead of queueing CPU work in front of the streams."""

from __future__ import annotations

import asyncio
import io
import threading
import time

import numpy as np
import pytest
import soundfile
from aiohttp.test_utils import TestClient

import voxwire.serving.http.voices as voice_routes

from .conftest import Serve
from .test_voices import clip, form, upload

pytestmark = pytest.mark.asyncio


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
    decoding, release = threading.Event(), threading.Event()
    real_load_clip = voice_routes.load_clip

    def slow_load_clip(*args: object, **kwargs: object) -> np.ndarray:
        decoding.set()
        release.wait(30)
        return real_load_clip(*args, **kwargs)

    monkeypatch.setattr(voice_routes, "load_clip", slow_load_clip)
    first = asyncio.create_task(upload(client, clip()))
    await asyncio.to_thread(decoding.wait, 30)
    async with client.post("/v1/voices", data=form(clip())) as second:
        assert second.status == 503
        assert (await second.json())["error"]["code"] == "busy"
        assert second.headers["Retry-After"] == "1"
    release.set()
    status, body = await first
    assert status == 201, body
    assert (await upload(client, clip()))[0] == 201  # the slot is free again
