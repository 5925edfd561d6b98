"""What the framework-service tests share: the server's view of them (WebSocket upgrades, engine requests and
steps), a saved voice, and the audio a voice speaks when asked alone.

* ``counted_serve(**config)``: the in-process server of ``serve`` and a list that gets one entry per WebSocket
  upgrade asked of it (how many connections a client opened).
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import soundfile
from aiohttp import web
from aiohttp.test_utils import TestServer

from voxwire.integrations.session import Audio, SpeechSession, SpeechSettings
from voxwire.protocol.wire import STREAM_PATH, Done
from voxwire.serving.runtime.keys import SPEAKER_KEY
from voxwire.serving.speech.service import SpeechJob

TIMEOUT_S = 60.0

CountedServe = Callable[..., Awaitable[tuple[TestServer, list[str]]]]


@pytest_asyncio.fixture
async def counted_serve(serve: Any, app_factory: Callable[..., web.Application]) -> CountedServe:
    async def start(**config: Any) -> tuple[TestServer, list[str]]:
        upgrades: list[str] = []

        @web.middleware
        async def count(request: web.Request, handler: Any) -> web.StreamResponse:
            # counted on the way in: the handler of a WebSocket returns only when the connection closes
            if request.path == STREAM_PATH and request.headers.get("Upgrade", "").lower() == "websocket":
                upgrades.append(request.path)
            return await handler(request)

        app = app_factory(**config)
        app.middlewares.append(count)
        return await serve(app=app), upgrades

    return start


async def save_voice(server: TestServer) -> str:
    """A voice saved on ``server`` from a one-second chirp (``POST /v1/voices``); its id."""
    t = np.arange(16000) / 16000
    wav = io.BytesIO()
    soundfile.write(wav, (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32), 16000, format="WAV")
    form = aiohttp.FormData()
    form.add_field("file", wav.getvalue(), filename="me.wav", content_type="audio/wav")
    async with aiohttp.ClientSession() as http, http.post(server.make_url("/v1/voices"), data=form) as response:
        assert response.status == 201, await response.text()
        return str((await response.json())["id"])


async def solo_audio(server: TestServer, settings: SpeechSettings, text: str, rate: int) -> bytes:
    """The 16-bit audio ``text`` gets from a connection of its own with ``settings`` (the reference for a turn)."""
    url = str(server.make_url("/"))
    async with await SpeechSession.open(url, None, settings, rate) as session:
        await session.text(text)
        await session.end()
        pcm = b""
        async for event in session.events():
            if isinstance(event, Audio):
                pcm += event.pcm
            elif isinstance(event, Done):
                assert event.finish_reason in ("stop", "length"), event
                return pcm
    raise AssertionError("the connection ended before done")


def record_requests(app: object, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """(text, continued from a previous sentence) of every request the server's engine is given."""
    service = app[SPEAKER_KEY]  # type: ignore[index]
    requests: list[tuple[str, bool]] = []
    speak = service.speak

    def recording(job: SpeechJob) -> object:
        requests.append((job.text, job.voice is not None))
        return speak(job)

    monkeypatch.setattr(service, "speak", recording)
    return requests
