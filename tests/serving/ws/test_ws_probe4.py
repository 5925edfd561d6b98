"""Regression tests of probe 4's WebSocket defects (``security-probe-4.md``).

F4: a socket ended by the ping timeout was no longer counted, yet aiohttp left its TCP connection open while its
send buffer could not drain.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from voxwire.protocol.wire import End, Start, Text, encode
from voxwire.serving.keys import SESSIONS_KEY

from .conftest import ClipService, clip_app, until
from .test_ws_limits import masked_text_frame, stalled_client

pytestmark = pytest.mark.asyncio

TIMEOUT_S = 30.0


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
