"""A replica behind a load balancer: refusals come as HTTP 503 with ``Retry-After`` before any response has
begun (so the balancer can retry another replica), and every response names the replica that answered."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import WSServerHandshakeError
from aiohttp.test_utils import TestClient
from websockets.asyncio.client import connect

from voxwire.cli.main import build_parser
from voxwire.cli.serve import config_from_args
from voxwire.engine import SynthesisParams
from voxwire.protocol.wire import STREAM_PATH
from voxwire.serving.runtime.keys import SPEAKER_KEY, STATE_KEY, Phase
from voxwire.serving.speech.service import SpeechJob

TEXT = "Hello from the test."
SPEECH = {"model": "tts-1", "input": TEXT}


@pytest.mark.asyncio
async def test_speech_while_draining_is_503_with_retry_after(serve, aiohttp_client) -> None:
    client: TestClient = await aiohttp_client(await serve(replica_id="replica-a"))
    client.server.app[STATE_KEY].phase = Phase.DRAINING
    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        assert response.headers["X-Voxwire-Replica"] == "replica-a"
        assert (await response.json())["error"]["code"] == "shutting_down"
    client.server.app[STATE_KEY].phase = Phase.READY


@pytest.mark.asyncio
async def test_every_response_names_the_replica(serve, aiohttp_client) -> None:
    client: TestClient = await aiohttp_client(await serve(replica_id="pod-7"))
    for path in ("/health", "/ready", "/metrics", "/no-such-path"):
        async with client.get(path) as response:
            assert response.headers["X-Voxwire-Replica"] == "pod-7", path
    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        assert response.status == 200
        assert response.headers["X-Voxwire-Replica"] == "pod-7"
        await response.read()
    async with connect(str(client.make_url(STREAM_PATH)).replace("http", "ws", 1)) as ws:
        assert ws.response.headers["X-Voxwire-Replica"] == "pod-7"


@pytest.mark.asyncio
async def test_a_full_engine_queue_refuses_new_connections_before_the_upgrade(serve, aiohttp_client) -> None:
    client: TestClient = await aiohttp_client(await serve(max_sessions=1, max_waiting=1))
    service = client.server.app[SPEAKER_KEY]
    long = SynthesisParams(min_len=10_000, max_len=10_000)  # keeps its slot until aborted
    running = service.speak(SpeechJob("hold-slot", TEXT, long))
    await anext(running)  # it holds the only slot
    waiting = service.speak(SpeechJob("hold-queue", TEXT, long))
    queued = asyncio.ensure_future(anext(waiting))
    try:
        while service.engine.stats().waiting < 1:  # the engine publishes its load after each step
            await asyncio.sleep(0.01)
        with pytest.raises(WSServerHandshakeError) as refused:
            await client.ws_connect(STREAM_PATH)
        assert refused.value.status == 503
        assert refused.value.headers is not None and refused.value.headers["Retry-After"] == "1"
    finally:
        await running.aclose()
        await queued
        await waiting.aclose()
    ws = await client.ws_connect(STREAM_PATH)  # room again
    await ws.close()


def test_replica_id_comes_from_the_flag_or_the_hostname() -> None:
    parse = build_parser().parse_args
    assert config_from_args(parse(["serve", "--replica-id", "gpu-3"]), environ={}).transport.replica_id == "gpu-3"
    assert config_from_args(parse(["serve"]), environ={}).transport.replica_id == socket.gethostname()
    with pytest.raises(ValueError, match="replica_id"):
        config_from_args(parse(["serve", "--replica-id", "bad id\r\n"]), environ={})
