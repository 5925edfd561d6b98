"""One way to fail (issue 10): the WebSocket and HTTP paths report an engine failure with the same code."""

from __future__ import annotations

import pytest

from voxwire.protocol.wire import STREAM_PATH, End, Error, Ready, Text
from voxwire.serving.keys import SERVICE_KEY

from .ws.conftest import StreamClient

pytestmark = pytest.mark.asyncio

SPEECH = {"model": "m", "input": "Hello there.", "response_format": "pcm", "seed": 1}


async def test_a_stopped_engine_is_the_same_failure_on_both_transports(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve())
    stream = StreamClient(await client.ws_connect(STREAM_PATH))
    await stream.expect(Ready)
    await client.server.app[SERVICE_KEY].stop()

    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        http_status, http_code = response.status, (await response.json())["error"]["code"]
    await stream.send(Text("Hello there."))
    await stream.send(End())
    while not isinstance(received := await stream.receive(), Error):
        pass
    assert (http_status, http_code) == (503, "unavailable")
    assert received.code == http_code
