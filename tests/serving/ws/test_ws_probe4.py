"""Regression tests of probe 4's WebSocket defects (``security-probe-4.md``, F1 and F4).

F1: sockets upgraded on the ElevenLabs routes without an API key (their key may come in the first message) held
every slot of ``max_connections`` until the idle limit, locking authenticated clients out. F4: a socket ended by the
ping timeout was no longer counted, yet aiohttp left its TCP connection open while its send buffer could not drain.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestServer

from voxwire.protocol.wire import CloseCode, End, Start, Text, encode
from voxwire.serving.runtime.keys import KEYLESS_KEY, SESSIONS_KEY
from voxwire.serving.ws.handler import STREAM_PATH

from .conftest import ClipService, clip_app, until
from .helpers import UPGRADE, masked_text_frame, stalled_client

pytestmark = pytest.mark.asyncio

KEY = "sk-test"
KEYLESS = "/v1/text-to-speech/default/stream-input"
TIMEOUT_S = 30.0


# ---- F1: keyless ElevenLabs sockets ------------------------------------------------------------------------------


async def upgrade(session: aiohttp.ClientSession, server: TestServer, path: str, **kwargs: Any) -> Any:
    return await session.ws_connect(server.make_url(path), **kwargs)


async def refused_status(session: aiohttp.ClientSession, server: TestServer, path: str, **kwargs: Any) -> int:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await upgrade(session, server, path, **kwargs)
    return refused.value.status


async def test_keyless_sockets_never_lock_an_authenticated_client_out(serve) -> None:
    """The probe's attack at the smallest shape: as many keyless sockets as ``max_connections``, then a client with
    a key on our own endpoint, and one on the ElevenLabs endpoint with its key in the header."""
    server = await serve(api_keys=(KEY,), max_connections=2)
    async with aiohttp.ClientSession() as session:
        keyless = [await upgrade(session, server, KEYLESS) for _ in range(2)]
        authenticated = await upgrade(session, server, STREAM_PATH, headers={"Authorization": f"Bearer {KEY}"})
        eleven = await upgrade(session, server, KEYLESS, headers={"xi-api-key": KEY})
        assert await refused_status(session, server, STREAM_PATH, headers={"Authorization": f"Bearer {KEY}"}) == 503
        for ws in (*keyless, authenticated, eleven):
            await ws.close()


async def test_keyless_sockets_have_a_cap_of_their_own(serve) -> None:
    server = await serve(api_keys=(KEY,), max_connections=4, max_keyless_connections=2)
    async with aiohttp.ClientSession() as session:
        keyless = [await upgrade(session, server, KEYLESS) for _ in range(2)]
        assert await refused_status(session, server, KEYLESS) == 503
        async with session.get(server.make_url(KEYLESS), headers=UPGRADE) as response:
            assert response.status == 503 and (await response.json())["error"]["code"] == "busy"
        await keyless[0].close()
        await until(lambda: len(keyless_sockets(server)) == 1)
        keyless[0] = await upgrade(session, server, KEYLESS)  # a freed place is taken again
        for ws in keyless:
            await ws.close()


async def test_a_silent_keyless_socket_is_closed_with_1008_at_its_key_deadline(serve) -> None:
    server = await serve(api_keys=(KEY,), key_timeout_s=0.3)
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(KEYLESS)) as ws:
        closing = await asyncio.wait_for(ws.receive(), 10.0)
    assert closing.type is WSMsgType.CLOSE and closing.data == 1008
    assert closing.extra.startswith("unauthorized") and "0.3 s" in closing.extra
    await until(lambda: not keyless_sockets(server))


async def test_a_key_in_the_first_message_moves_the_socket_to_the_authenticated_count(serve) -> None:
    server = await serve(api_keys=(KEY,), max_connections=1, key_timeout_s=0.2)
    async with aiohttp.ClientSession() as session:
        first = await upgrade(session, server, KEYLESS)
        await first.send_json({"text": " ", "xi_api_key": KEY})
        await until(lambda: len(server.app[SESSIONS_KEY]) == 1 and not keyless_sockets(server))
        await asyncio.sleep(0.4)  # past the key deadline: an authenticated socket is not closed by it
        assert not first.closed
        # the server is full now: a second socket's key finds no place, and it is told to come back later
        second = await upgrade(session, server, KEYLESS)
        await second.send_json({"text": " ", "xi_api_key": KEY})
        closing = await asyncio.wait_for(second.receive(), 10.0)
        assert closing.type is WSMsgType.CLOSE and closing.data == CloseCode.TRY_AGAIN_LATER
        assert closing.extra.startswith("busy")
        await first.close()


def keyless_sockets(server: TestServer) -> set[Any]:
    return server.app[KEYLESS_KEY]


# ---- F4: a socket ended by the ping timeout -----------------------------------------------------------------------


async def test_a_socket_ended_by_the_ping_timeout_is_cut_and_counted_until_its_connection_is_gone(serve) -> None:
    rate, patch = 48000, 4800
    # Far more audio than the socket's buffers hold, and no slow-consumer cut: only the ping timeout ends it.
    service = ClipService(np.zeros(120 * rate, dtype=np.float32), rate, patch)
    server = await serve(app=clip_app(service, ping_interval_s=1.0, max_unsent_audio_s=1000.0))
    sock = await stalled_client(server.host, server.port)  # never reads, so it never answers a ping either
    loop = asyncio.get_running_loop()
    for message in (Start(format="pcm_f32le"), Text("Speak for two minutes."), End()):
        await loop.sock_sendall(sock, masked_text_frame(encode(message)))
    assert server.runner is not None and server.runner.server is not None
    (connection,) = server.runner.server.connections
    transport, sessions = connection.transport, server.app[SESSIONS_KEY]
    assert transport is not None and len(sessions) == 1
    # Precondition: the socket stopped draining before the ping timeout, the state in which aiohttp's own close
    # leaves the TCP connection open.
    await until(lambda: transport.get_write_buffer_size() > 0 or not sessions, TIMEOUT_S)
    assert sessions, "the socket never filled before the ping timeout: this test would prove nothing"

    def gone() -> bool:
        assert sessions or connection.transport is None, "the socket left the count while its connection is open"
        return connection.transport is None

    await until(gone, 10.0)
    assert not sessions
    sock.close()
