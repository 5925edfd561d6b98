"""Fixtures that run the real server app in process, on a free port, with a tiny random model on CPU.

For a test (``pytestmark = pytest.mark.asyncio`` in the module, as pytest-asyncio runs in strict mode):

* ``serve(**overrides)`` starts an app made by ``make_app(_config(**overrides), model=VoxCPMSpeech(tiny_tts))`` on
  ``127.0.0.1:<free port>`` (a ``ServerUnderTest``), waits until it is warmed up and
  ready, and returns the ``TestServer`` (``server.app``, ``server.make_url(path)``); ``serve(app=...)``
  starts an app you built yourself with ``app_factory(**overrides)`` (e.g. to add a test route).
  The server runs with the production runner (``make_runner``: header timeout, access log, guarded connections).
  Every server is closed (gracefully: ``drain`` runs) at teardown.
* ``client``: an ``aiohttp.test_utils.TestClient`` on a default server (``client.ws_connect(path)``,
  ``client.post(path, json=...)``, ``client.server.app``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from voxwire.serving.app import make_app, make_runner
from voxwire.serving.runtime.keys import STATE_KEY
from voxwire.serving.server_config import ServerConfig
from voxwire.speech_model import VoxCPMSpeech
from voxwire.tts import VoxCPM

READY_TIMEOUT_S = 60.0

Serve = Callable[..., Awaitable[TestServer]]


def _config(**overrides: Any) -> ServerConfig:
    """A config for in-process tests: a free port, few slots, short drain, and the engine flat out (real-time
    pacing would make each utterance last as long as its audio; tests/serving/test_realtime.py runs it on)."""
    settings: dict[str, Any] = {
        "port": 0, "max_sessions": 4, "max_waiting": 16, "drain_timeout_s": 10.0, "realtime": False,
    }  # fmt: skip
    settings.update(overrides)
    return ServerConfig.of(**settings)


async def wait_ready(app: web.Application, timeout: float = READY_TIMEOUT_S) -> None:
    """Wait until the app's warm-up is done and it accepts work."""

    async def accepting() -> None:
        while not app[STATE_KEY].accepting:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(accepting(), timeout)


LORA = Path(__file__).parents[1] / "fixtures" / "reference" / "lora" / "voxcpm2"
"""A LoRA adapter made by the reference's own code for the tiny voxcpm2 checkpoint (LM, DiT and projections)."""


@pytest.fixture
def persona_app(persona_tts: VoxCPM) -> Callable[..., web.Application]:
    """``persona_app(**overrides)``: an app on ``persona_tts`` with persona ``A`` (``LORA``) loaded at startup;
    personas left by an earlier test are removed first."""

    def build(**overrides: Any) -> web.Application:
        bank = persona_tts.personas
        for name in list(bank.adapters) if bank is not None else []:
            bank.remove(name)
        settings: dict[str, Any] = {"loras": (("A", LORA),), "max_lora_rank": 16, **overrides}
        return make_app(_config(**settings), model=VoxCPMSpeech(persona_tts))

    return build


@pytest.fixture
def app_factory(tiny_tts: VoxCPM) -> Callable[..., web.Application]:
    """``app_factory(**overrides)``: a not yet started app on the tiny model, to add test routes to."""

    def build(**overrides: Any) -> web.Application:
        return make_app(_config(**overrides), model=VoxCPMSpeech(tiny_tts))

    return build


class ServerUnderTest(TestServer):
    """A ``TestServer`` with the production runner (``make_runner``: its options and guarded connections)."""

    async def _make_runner(self, **options: Any) -> web.BaseRunner:
        return make_runner(self.app, **options)


@pytest_asyncio.fixture
async def serve(app_factory: Callable[..., web.Application]) -> AsyncIterator[Serve]:
    servers: list[TestServer] = []

    async def start(app: web.Application | None = None, **overrides: Any) -> TestServer:
        if app is None:
            app = app_factory(**overrides)
        server = ServerUnderTest(app)
        await server.start_server()
        servers.append(server)
        await wait_ready(app)
        return server

    yield start
    while servers:
        await servers.pop().close()


@pytest_asyncio.fixture
async def client(serve: Serve, aiohttp_client: Callable[..., Awaitable[TestClient]]) -> TestClient:
    return await aiohttp_client(await serve())
