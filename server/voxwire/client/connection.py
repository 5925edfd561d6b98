"""One WebSocket connection to ``/v1/tts/stream``: addressing, authentication and typed messages.

The bytes on the wire are ``voxwire.protocol.wire``'s; this module adds the socket (the
``websockets`` asyncio client) and turns every way a connection can fail into a ``ClientError``.
"""

from __future__ import annotations

import json
import os
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from voxwire.client.errors import (
    AuthenticationError,
    ConnectionLostError,
    ServerBusyError,
    ServerError,
    ServerUnreachableError,
)
from voxwire.errors import InvalidInputError
from voxwire.protocol.wire import (
    STREAM_PATH,
    AudioFrame,
    ClientMessage,
    CloseCode,
    Error,
    ErrorCode,
    ProtocolError,
    Ready,
    ServerMessage,
    Start,
    decode_server,
    encode,
)

DEFAULT_SERVER = "ws://127.0.0.1:8000"
TOKEN_ENV = "VOXWIRE_TOKEN"
"""Environment variable holding the API key, so it stays out of ``ps`` output and shell history."""

OPEN_TIMEOUT_S = 10.0

RETRY_STATUSES = frozenset({502, 503, 504})
"""Upgrade answers that mean "not now": a refusing replica (503) or a balancer with no replica to offer."""
_REFUSALS = frozenset({ErrorCode.BUSY.value, ErrorCode.UNAVAILABLE.value})
"""Error codes a server refuses a new connection with before its first ``ready`` (then closes with 1013)."""

Received = ServerMessage | AudioFrame


def endpoint_url(server: str) -> str:
    """The WebSocket URL for ``server``: ``host:port``, ``ws[s]://host:port``, ``http[s]://...`` or a full URL."""
    parts = urlsplit(server if "://" in server else f"ws://{server}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise InvalidInputError(f"--server must look like ws://host:port (or wss://, http://), got {server!r}")
    path = parts.path if parts.path not in ("", "/") else STREAM_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def token_from_env(token: str | None) -> str | None:
    return token if token else os.environ.get(TOKEN_ENV) or None


class Connection:
    """An open session; ``ready`` holds the settings the server last announced. Use ``async with``."""

    def __init__(self, ws: ClientConnection, ready: Ready) -> None:
        self.ws = ws
        self.ready = ready

    @classmethod
    async def open(cls, server: str, token: str | None = None, *, timeout: float = OPEN_TIMEOUT_S) -> Connection:
        """Connect and read the server's first ``ready``. Raises a ``ClientError`` subclass."""
        url = endpoint_url(server)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            # Audio frames are small but their count is not bounded here; compression would only cost CPU on audio.
            ws = await connect(url, additional_headers=headers, open_timeout=timeout, max_size=None, compression=None)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise AuthenticationError(
                    f"{url} refused the connection (HTTP {status}): check --token or ${TOKEN_ENV}"
                ) from None
            if status in RETRY_STATUSES:
                raise ServerBusyError(
                    f"{url} refused the connection for now (HTTP {status}{_reason(exc)})", _retry_after(exc)
                ) from None
            raise ServerUnreachableError(
                f"{url} answered HTTP {status}, not a WebSocket: is it a voxwire server?"
            ) from None
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            raise ServerUnreachableError(f"cannot connect to {url}: {exc or type(exc).__name__}") from None
        try:
            ready = await _expect_ready(ws)
        except ServerError as exc:
            await ws.close()
            if exc.code in _REFUSALS:
                raise ServerBusyError(f"{url} refused the connection for now ({exc.code}: {exc.message})") from None
            raise
        except BaseException:
            await ws.close()
            raise
        return cls(ws, ready)

    @property
    def replica(self) -> str | None:
        """The replica that took this connection (its ``X-Voxwire-Replica`` header), when the server names it."""
        response = self.ws.response
        return None if response is None else response.headers.get("X-Voxwire-Replica")

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.ws.close()

    async def send(self, message: ClientMessage) -> None:
        try:
            await self.ws.send(encode(message))
        except ConnectionClosed as exc:
            raise _closed(exc) from None

    async def receive(self) -> Received:
        """The next message or audio frame; an ``error`` message is returned, a closed socket raises."""
        return await _receive(self.ws)

    async def configure(self, start: Start) -> Ready:
        """Send ``start`` and wait for its ``ready`` (call between utterances)."""
        await self.send(start)
        self.ready = await _expect_ready(self.ws)
        return self.ready


async def _receive(ws: ClientConnection) -> Received:
    try:
        data = await ws.recv()
    except ConnectionClosed as exc:
        raise _closed(exc) from None
    try:
        return AudioFrame.decode(data) if isinstance(data, bytes) else decode_server(data)
    except ProtocolError as exc:
        raise ServerError(exc.code.value, f"unreadable message from the server: {exc.message}") from None


async def _expect_ready(ws: ClientConnection) -> Ready:
    message = await _receive(ws)
    if isinstance(message, Error):
        raise ServerError(message.code, message.message)
    if not isinstance(message, Ready):
        raise ServerError("unexpected_message", f"expected ready, got {message!r}")
    return message


def _closed(exc: ConnectionClosed) -> ServerError:
    """The close frame as an error: the server's close reason starts with its ``ErrorCode``.

    No close frame (1006) or 1001 is a ``ConnectionLostError``: the session was cut, not refused."""
    frame = exc.rcvd
    if frame is None:
        return ConnectionLostError("connection_lost", "the connection broke without a close frame (1006)", 1006)
    if frame.code == CloseCode.GOING_AWAY:
        reason = frame.reason or "the server went away"
        return ConnectionLostError("going_away", f"{reason} (1001)", CloseCode.GOING_AWAY)
    code, _, text = frame.reason.partition(": ")
    if not code:
        code = ErrorCode.BUSY.value if frame.code == CloseCode.TRY_AGAIN_LATER else f"closed_{frame.code}"
    return ServerError(code, text or f"the server closed the connection ({frame.code})")


def _retry_after(exc: InvalidStatus) -> float | None:
    """The ``Retry-After`` seconds of a refused upgrade (the HTTP-date form is not used by voxwire)."""
    value = exc.response.headers.get("Retry-After", "")
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _reason(exc: InvalidStatus) -> str:
    """``: code`` from the JSON error envelope of a refused upgrade, when it has one."""
    try:
        code = json.loads(exc.response.body or b"")["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return ""
    return f": {code}" if isinstance(code, str) else ""
