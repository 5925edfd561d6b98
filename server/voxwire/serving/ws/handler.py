"""The WebSocket endpoint ``/v1/tts/stream``: admission, then frames in and out of a ``Session``.

This module only adapts aiohttp to the session: it refuses a connection with HTTP 503 before the
upgrade while the replica is not ready, draining or full (``edge/admission.py``: a balancer can retry a
503 elsewhere, not a socket it has upgraded), registers the socket for shutdown, feeds each client
frame to the ``Session`` (whose ``SessionCore`` holds every rule of the protocol, see ``session_core.py``
and ``protocol/wire.py``), and writes the session's typed events as our protocol's frames (``Socket``, the one
place that knows their bytes) with a close that cannot hang on a client that stopped reading. ElevenLabs'
endpoints (``elevenlabs.py``) use the same admission, frame loop and close.
However the socket ends, its TCP connection is cut and only then does it leave the count (``upgraded``).
Authentication and the Origin check happen before, in ``auth.auth_middleware``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from aiohttp import WSMsgType, web

from voxwire.protocol.wire import STREAM_PATH, Audio, AudioFrame, CloseCode, ServerMessage, encode
from voxwire.serving.edge.admission import Refusal, refusal, require_admission
from voxwire.serving.runtime.encoding import INLINE
from voxwire.serving.runtime.keys import (
    CONFIG_KEY,
    ENCODERS_KEY,
    ENGINES_KEY,
    KEYLESS_KEY,
    METRICS_KEY,
    OWNER_KEY,
    SESSIONS_KEY,
    STATE_KEY,
    TRACING_KEY,
    VOICES_KEY,
)
from voxwire.serving.runtime.timeouts import within
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.persona_names import client_owner
from voxwire.serving.ws.frames import StreamSocket
from voxwire.serving.ws.session import Session

HARD_SIZE_FACTOR = 4
"""A message up to this many times ``max_message_bytes`` is read and answered with ``message_too_large``;
a larger one is refused by aiohttp before it is read (close code 1009), which bounds a reader's memory."""

CLOSE_TIMEOUT_S = 2.0
"""How long a close handshake may take before the TCP connection is cut (a client that stopped reading
never answers it)."""


def stream_socket(config: ServerConfig) -> StreamSocket:
    """The WebSocket of a streaming endpoint, bounded by ``config``'s message size and pinged at its interval."""
    # No permessage-deflate: audio does not compress, and compressing it would cost CPU per session.
    return StreamSocket(
        max_message_bytes=config.limits.max_message_bytes,
        heartbeat=config.transport.ping_interval_s,
        max_msg_size=HARD_SIZE_FACTOR * config.limits.max_message_bytes,
        compress=False,
    )


class CountedSocket:
    """Where an upgraded socket counts until its TCP connection is gone: among the server's connections
    (``SESSIONS_KEY``, bounded by ``max_connections``) or, while it has not shown an API key, among the keyless
    ones (``KEYLESS_KEY``, bounded by ``max_keyless_connections``), so that clients without a key cannot take
    the places of those with one."""

    def __init__(self, app: web.Application, ws: web.WebSocketResponse, *, keyless: bool) -> None:
        """Admit and count ``ws`` (``keyless``: the request showed no API key), or raise the refusal's 503 with
        ``Retry-After`` (``admission.require_admission``): call it before the 101."""
        self._app = app
        self._ws = ws
        self._seats = app[STATE_KEY].seats
        with self._seats.taking():  # with --workers, no other frontend admits one between the check and the count
            require_admission(app, connection=True, keyless=keyless)
            self._sockets = app[KEYLESS_KEY] if keyless else app[SESSIONS_KEY]
            self._take()

    def authenticated(self) -> Refusal | None:
        """The keyless socket has shown a valid key: from now it counts among the server's connections, if the
        rule that admits an upgrade admits it now (``admission.refusal``); else why not (it is still keyless)."""
        with self._seats.taking():
            refused = refusal(self._app, connection=True)
            if refused is None:
                self._sockets.discard(self._ws)
                self._sockets = self._app[SESSIONS_KEY]
                self._take()
        return refused

    def release(self) -> None:
        self._sockets.discard(self._ws)
        self._seats.publish(len(self._app[SESSIONS_KEY]))

    def _take(self) -> None:
        self._sockets.add(self._ws)
        self._seats.publish(len(self._app[SESSIONS_KEY]))


@contextlib.asynccontextmanager
async def upgraded(request: web.Request, ws: StreamSocket, *, keyless: bool = False) -> AsyncIterator[CountedSocket]:
    """``ws`` admitted (else its 503 before the 101), upgraded, and counted (``CountedSocket``; ``keyless``: the
    request showed no API key) until its TCP connection is gone: the check and the count happen together, so
    concurrent upgrades cannot exceed the limit. When the block ends (the socket closed by either side or by the
    ping timeout, or the handler failed) the connection is cut: aiohttp's own close waits for the send buffer to
    drain, which a client that stopped reading never lets happen, and the socket would stay open, no longer
    counted. A request that cannot be upgraded (not a WebSocket handshake) gets its HTTP error, uncut."""
    counted = CountedSocket(request.app, ws, keyless=keyless)
    try:
        await ws.prepare(request)
    except BaseException:
        counted.release()
        raise
    try:
        yield counted
    finally:
        try:
            await cut(request.transport)
        finally:
            counted.release()


async def cut(transport: asyncio.Transport | None) -> None:
    """Drop the TCP connection now, whatever is still unsent, and return once its file descriptor is closed."""
    if transport is not None:
        transport.abort()
        await asyncio.sleep(0)  # abort() closes the socket in a callback it schedules: let it run first


async def close_and_cut(
    ws: web.WebSocketResponse, transport: asyncio.Transport | None, code: int, reason: bytes
) -> None:
    """Close ``ws`` with ``code`` and ``reason``, waiting at most ``CLOSE_TIMEOUT_S`` for the handshake (a client
    that stopped reading never answers it), then cut the connection: a closed transport keeps its socket until its
    write buffer drains, and the handler reading the socket would wait for that too."""
    try:
        # within, not wait_for: a session's outbox cancelled as the client's close answer arrives must end
        await within(ws.close(code=code, message=reason), CLOSE_TIMEOUT_S)
    except (asyncio.TimeoutError, ConnectionError):
        pass  # the connection is cut below all the same
    finally:
        await cut(transport)


def add_ws_routes(app: web.Application) -> None:
    app.router.add_get(STREAM_PATH, stream)


class FrameReceiver(Protocol):
    """What takes a socket's client frames (``Session`` fits)."""

    def receive(self, data: str) -> None: ...

    def receive_binary(self) -> None: ...


async def receive_frames(ws: web.WebSocketResponse, receiver: FrameReceiver) -> None:
    """Feed ``ws``'s frames to ``receiver`` until the socket closes."""
    async for message in ws:
        if message.type is WSMsgType.TEXT:
            receiver.receive(message.data)
        elif message.type is WSMsgType.BINARY:
            receiver.receive_binary()
        # Messages already buffered are returned without a suspension: yield, so that a
        # client sending many at once takes turns with every other connection.
        await asyncio.sleep(0)


class Socket:
    """A session's typed events as our protocol's frames on an aiohttp WebSocket (``outbox.Transport``)."""

    def __init__(self, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.ws = ws
        self.transport = request.transport

    async def send(self, message: ServerMessage) -> None:
        await self.ws.send_str(encode(message))

    async def send_frame(self, frame: AudioFrame, audio_transport: str) -> None:
        if audio_transport == "json":
            await self.ws.send_str(encode(Audio.of(frame)))
        else:
            await self.ws.send_bytes(frame.encode())

    async def end_context(self, context_id: str | None) -> None:
        """Nothing to say: on our protocol a context ends only when its client closes it (``close_context``)."""

    async def close(self, code: CloseCode, reason: str) -> None:
        await close_and_cut(self.ws, self.transport, code, reason.encode())


async def stream(request: web.Request) -> web.WebSocketResponse:
    app = request.app
    config = app[CONFIG_KEY]
    ws = stream_socket(config)
    async with upgraded(request, ws):  # refused before the 101 (503, Retry-After): a balancer can try elsewhere
        socket = Socket(ws, request)
        session = Session(
            app[ENGINES_KEY].pinned(),  # a connection's utterances stay on one engine (voice continuation)
            config,
            app[VOICES_KEY],
            app[STATE_KEY],
            socket,
            app.get(METRICS_KEY),
            app.get(ENCODERS_KEY, INLINE),
            client_owner(request.get(OWNER_KEY), ws),
            app.get(TRACING_KEY),
        )
        async with session:
            await receive_frames(ws, session)
    return ws
