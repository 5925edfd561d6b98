"""One way to fail (issue 10): the WebSocket and HTTP paths report an engine failure with the same code; a stream
it cuts short is cut quietly (issue 29)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

import aiohttp
import numpy as np
import pytest

from voxwire.chunk import Chunk
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import STREAM_PATH, End, Error, Ready, Text
from voxwire.serving.runtime.keys import ENGINES_KEY, SPEAKER_KEY
from voxwire.serving.speech.service import SpeechFailure, SpeechJob

from .ws.conftest import StreamClient

pytestmark = pytest.mark.asyncio

SPEECH = {"model": "m", "input": "Hello there.", "response_format": "pcm", "seed": 1}


async def test_a_stopped_engine_is_the_same_failure_on_both_transports(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve())
    stream = StreamClient(await client.ws_connect(STREAM_PATH))
    await stream.expect(Ready)
    await client.server.app[ENGINES_KEY].stop()

    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        http_status, http_code = response.status, (await response.json())["error"]["code"]
    await stream.send(Text("Hello there."))
    await stream.send(End())
    while not isinstance(received := await stream.receive(), Error):
        pass
    assert (http_status, http_code) == (503, "unavailable")
    assert received.code == http_code


async def test_a_stream_cut_by_an_engine_death_logs_one_info_line(serve, aiohttp_client, monkeypatch, caplog) -> None:
    """Probe 4's N9r: a speech stream cut mid-body by an engine's death logged ERROR with two tracebacks."""
    caplog.set_level(logging.INFO)
    client = await aiohttp_client(await serve())
    service = client.server.app[SPEAKER_KEY]

    async def dies_after_a_chunk(job: SpeechJob) -> AsyncGenerator[Chunk, None]:
        yield Chunk(job.request_id, np.zeros(service.info.samples_per_patch, np.float32))
        raise SpeechFailure(ErrorCode.UNAVAILABLE, "the engine process died")

    monkeypatch.setattr(service, "speak", dies_after_a_chunk)
    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):  # the body is cut: no client takes it for a whole one
            await response.read()
    await asyncio.sleep(0.1)
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
    assert [record.levelno for record in caplog.records if "the engine process died" in record.getMessage()] == [
        logging.INFO
    ]
