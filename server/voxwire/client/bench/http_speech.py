"""``POST /v1/audio/speech`` for ``voxwire bench --http``: the request body, and a small HTTP/1.1 client that hands
over the response body chunk by chunk as it arrives.

The client side installs without aiohttp (``tests/project/test_layers.py``), and a load tool must see each chunk
of the streamed body when it arrives, so the request is written and the response read on an asyncio stream: one
connection per request (``Connection: close``), the chunked body the server streams (or a ``Content-Length`` body,
or one read to the end). Every failure becomes the ``ClientError`` the WebSocket client raises for the same cause:
no connection ``ServerUnreachableError``, 401/403 ``AuthenticationError``, 502/503/504 ``ServerBusyError`` (retried
by the caller), any other status ``ServerError`` with the code of the server's JSON error, and a chunked body cut
short (the server aborts a response whose utterance failed mid-way) ``ServerError("connection_lost")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import ssl
import time
from collections.abc import AsyncIterator
from types import TracebackType
from urllib.parse import urlsplit

from voxwire.client.bench.measure import RequestKind
from voxwire.client.connection import RETRY_STATUSES, TOKEN_ENV, endpoint_url
from voxwire.client.errors import AuthenticationError, ServerBusyError, ServerError, ServerUnreachableError
from voxwire.protocol.wire import STREAM_PATH

SPEECH_PATH = "/v1/audio/speech"
CONNECT_TIMEOUT_S = 10.0
CONNECTION_LOST = "connection_lost"
"""The error code of a response whose body ended before its last chunk (the code a WebSocket client gets for 1006)."""
_ERROR_BODY_BYTES = 64 * 1024
"""At most this much of an error response is read for its JSON error."""


class Priority(str, enum.Enum):
    """``--priority``: the scheduling class a request asks for."""

    REALTIME = "realtime"
    """The server's default: nothing is sent."""
    BATCH = "batch"
    """An offline job that must not take capacity from live sessions: sent as the body's ``priority`` field."""


def speech_body(
    text: str,
    kind: RequestKind,
    response_format: str,
    *,
    voice: str | None = None,
    seed: int | None = None,
    persona: str | None = None,
    priority: Priority = Priority.REALTIME,
) -> dict[str, object]:
    """The JSON body of one request: OpenAI's fields, ``stream_format: audio`` for a stream (the raw body, the
    server's default, stated), and only the optional fields that were given (a default priority is not sent)."""
    body: dict[str, object] = {"model": "voxwire", "input": text, "response_format": response_format}
    if kind is RequestKind.HTTP_STREAM:
        body["stream_format"] = "audio"
    optional = {"voice": voice, "seed": seed, "persona": persona}
    body.update({name: value for name, value in optional.items() if value is not None})
    if priority is not Priority.REALTIME:
        body["priority"] = priority.value
    return body


def speech_url(server: str) -> str:
    """The ``/v1/audio/speech`` URL of the server that ``server`` (``--server``: ``host:port``, ``ws://...`` or the
    WebSocket endpoint's URL, also behind a path prefix) names."""
    parts = urlsplit(endpoint_url(server))
    prefix = parts.path.removesuffix(STREAM_PATH) if parts.path.endswith(STREAM_PATH) else ""
    scheme = "https" if parts.scheme == "wss" else "http"
    return f"{scheme}://{parts.netloc}{prefix}{SPEECH_PATH}"


class SpeechResponse:
    """An answered request (status 200): when its connection was open and its first byte came (``connected_at``,
    ``first_byte_at``: ``time.perf_counter()``) and ``chunks()``, the body as it arrives. Use ``async with``: the
    connection is closed at the end."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connected_at: float, first_byte_at: float
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.connected_at = connected_at
        self.first_byte_at = first_byte_at
        self.headers: dict[str, str] = {}

    async def __aenter__(self) -> SpeechResponse:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):  # already reset by the peer: nothing left to close
            await self._writer.wait_closed()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive (never empty); raises ``ServerError("connection_lost")`` when it is
        cut short."""
        try:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                async for chunk in self._chunked():
                    yield chunk
            elif "content-length" in self.headers:
                yield await self._reader.readexactly(int(self.headers["content-length"]))
            else:  # HTTP/1.0 style: the body ends with the connection
                while chunk := await self._reader.read(64 * 1024):
                    yield chunk
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            raise ServerError(CONNECTION_LOST, f"the response body was cut short: {exc}") from None

    async def _chunked(self) -> AsyncIterator[bytes]:
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:  # the last chunk: trailers (none from voxwire) up to a blank line
                while (await self._reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return
            chunk = await self._reader.readexactly(size)
            if await self._reader.readexactly(2) != b"\r\n":
                raise ValueError("a chunk without its CRLF")
            yield chunk


async def post_speech(url: str, body: dict[str, object], token: str | None) -> SpeechResponse:
    """Send the request and read the status line and headers; a 200 answer is returned with its body unread, any
    other raises its ``ClientError``."""
    parts = urlsplit(url)
    https = parts.scheme == "https"
    host, port = parts.hostname or "127.0.0.1", parts.port or (443 if https else 80)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ssl.create_default_context() if https else None),
            CONNECT_TIMEOUT_S,
        )
    except (OSError, asyncio.TimeoutError) as exc:
        raise ServerUnreachableError(f"cannot connect to {url}: {exc or type(exc).__name__}") from None
    connected_at = time.perf_counter()
    payload = json.dumps(body).encode()
    head = [
        f"POST {parts.path} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        "Connection: close",
    ]
    if token:
        head.append(f"Authorization: Bearer {token}")
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        status_line = await reader.readuntil(b"\r\n")
        first_byte_at = time.perf_counter()
        response = SpeechResponse(reader, writer, connected_at, first_byte_at)
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            response.headers[name.strip().lower()] = value.strip()
        status = int(status_line.split()[1])
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError, IndexError) as exc:
        writer.close()
        raise ServerError(CONNECTION_LOST, f"{url} sent no complete response head: {exc}") from None
    if status == 200:
        return response
    async with response:
        raise await _refusal(url, status, response)


async def _refusal(url: str, status: int, response: SpeechResponse) -> Exception:
    """The ``ClientError`` for a non-200 answer, with the code and message of the server's JSON error."""
    if status in (401, 403):
        return AuthenticationError(f"{url} refused the request (HTTP {status}): check --token or ${TOKEN_ENV}")
    text = b""
    try:
        async for chunk in response.chunks():
            text += chunk
            if len(text) > _ERROR_BODY_BYTES:
                break
    except ServerError:
        pass  # what came is all there is to read the error from
    try:
        error = json.loads(text)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"http_{status}", text[:200].decode(errors="replace")
    if status in RETRY_STATUSES:
        retry_after = response.headers.get("retry-after", "")
        return ServerBusyError(
            f"{url} refused the request for now (HTTP {status}: {code})",
            float(retry_after) if retry_after.replace(".", "", 1).isdigit() else None,
        )
    return ServerError(code, message)
