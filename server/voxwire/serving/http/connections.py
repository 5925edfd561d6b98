"""``GuardedConnection``: what one client's connection may hold of a server process, and how its errors are logged.

The rules, for every connection of ``voxwire serve`` (one process, or each frontend of ``--workers``):

* **Write deadline.** A client that leaves the server's data unsent for ``--write-timeout-s`` (its socket full: it
  stopped reading) has its connection aborted, whatever was being sent: a TCP reset, so that the socket and the
  data the kernel had not sent yet are freed at once (a close would keep megabytes for the client), and the
  handler's next write fails as a departed client's. The transport keeps no slack (``high=0``): it pauses writing
  as soon as one byte waits for the client and resumes when none does, so the deadline runs for exactly as long as
  data waits: in a response, between pipelined ones, on a WebSocket, and after aiohttp closed the connection with
  a tail unsent. Every response goes through the transport for this: nothing is sent with ``sendfile``, which
  writes around it (static files are sent as bodies).
* **Connection cap.** One process holds at most ``--max-http-connections`` HTTP connections; a WebSocket stops
  counting when it upgrades (``--max-connections`` caps those). One more gets a fixed 503 ``busy`` and is closed as
  it is accepted, before a byte of it is read.
* **Pipelining** is bounded by aiohttp: it parses a few dozen requests ahead of the one being answered at most,
  then stops reading the socket; a client that pipelines and never reads the answers meets the write deadline.
* **Client protocol errors** (a malformed request line or header, a body that cannot be decoded: aiohttp's
  ``HttpProcessingError`` and ``RequestPayloadError``) are the client's doing and cost one counter each: the first
  is logged at once, the rest as a count at most once per ``LOG_INTERVAL_S`` (``ThrottledLog``), never with a
  traceback; refused and aborted connections are logged the same way. A response a handler cut short on purpose
  (``errors.ResponseCut``) was logged where it was cut. Anything else aiohttp logs stays an ERROR with its
  traceback: that is a server bug.

``GuardedRunner`` is the ``web.AppRunner`` that makes these connections (``app.make_runner`` builds it).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import mimetypes
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import RETRY_AFTER_S, ApiError, ResponseCut
from voxwire.serving.edge.request_id import REQUEST_ID_HEADER, new_request_id
from voxwire.serving.server_config import Limits

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0
"""The shortest time between two log lines of one kind of connection event; the later line counts those between."""

CLIENT_PROTOCOL_ERRORS = (HttpProcessingError, web.RequestPayloadError)
"""What aiohttp raises for a request it cannot parse or a body it cannot decode: the client's errors."""

_LINGER_NONE = struct.pack("ii", 1, 0)
"""``SO_LINGER`` on, 0 s: closing the socket resets the connection and drops what the kernel had not sent."""

_LONGEST_REASON = 200
"""Characters of a client error's message that are logged (it may quote the client's bytes, escaped)."""


class ConnectionEvent(enum.Enum):
    """What the guard logs, each kind at its level."""

    MALFORMED_REQUEST = ("malformed request(s) refused", logging.INFO)
    OVER_CAPACITY = ("connection(s) refused: the process holds --max-http-connections", logging.WARNING)
    WRITE_TIMEOUT = ("connection(s) aborted: the client left data unsent for --write-timeout-s", logging.INFO)

    def __init__(self, what: str, level: int) -> None:
        self.what = what
        self.level = level


class ThrottledLog:
    """Logs connection events by kind: the first at once, then at most one line per ``interval_s`` saying how many
    came since the previous line and the last one's detail."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._quiet_until: dict[ConnectionEvent, float] = {}
        self._unlogged: dict[ConnectionEvent, tuple[int, str]] = {}

    def note(self, event: ConnectionEvent, detail: str) -> None:
        now = time.monotonic()
        quiet_until = self._quiet_until.get(event, 0.0)
        if now >= quiet_until:
            self._log(event, 1, detail)
            return
        count, _ = self._unlogged.get(event, (0, ""))
        if count == 0:
            asyncio.get_running_loop().call_later(quiet_until - now, self._flush, event)
        self._unlogged[event] = (count + 1, detail)

    def _flush(self, event: ConnectionEvent) -> None:
        count, detail = self._unlogged.pop(event)
        self._log(event, count, detail)

    def _log(self, event: ConnectionEvent, count: int, detail: str) -> None:
        logger.log(event.level, "%d %s (the last: %s)", count, event.what, detail)
        self._quiet_until[event] = time.monotonic() + self.interval_s


class ConnectionGuard:
    """What the connections of one server process share: the limits, how many are open, and the log."""

    def __init__(self, limits: Limits, reply_headers: Mapping[str, str]) -> None:
        """``reply_headers``: added to the 503 of a refused connection (the app's own responses carry them too)."""
        self.write_timeout_s = limits.write_timeout_s
        self.max_connections = limits.max_http_connections
        self.open = 0
        self.log = ThrottledLog()
        self._reply_headers = dict(reply_headers)

    def admit(self) -> bool:
        """Count one more connection, or refuse it (False) when the process holds ``max_connections``."""
        if self.open >= self.max_connections:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

    def busy_reply(self) -> bytes:
        """The whole 503 ``busy`` response to a connection over the cap: the error envelope, then close."""
        message = f"this server process holds {self.max_connections} HTTP connections, its limit; retry shortly"
        request_id = new_request_id()
        body = json.dumps(ApiError(ErrorCode.BUSY, message).body(request_id)).encode()
        headers = {
            hdrs.CONTENT_TYPE: "application/json; charset=utf-8",
            hdrs.CONTENT_LENGTH: str(len(body)),
            hdrs.RETRY_AFTER: str(RETRY_AFTER_S),
            hdrs.CONNECTION: "close",
            REQUEST_ID_HEADER: request_id,
            **self._reply_headers,
        }
        lines = ["HTTP/1.1 503 Service Unavailable", *(f"{name}: {value}" for name, value in headers.items()), "", ""]
        return "\r\n".join(lines).encode("latin-1") + body


async def static_file(path: Path, content_type: str | None = None) -> web.Response:
    """A small static file as a plain body, so that it goes through the connection's transport and its write
    deadline (aiohttp's ``FileResponse`` sends with ``sendfile``, around it); the type is guessed from the name
    unless given."""
    body = await asyncio.to_thread(path.read_bytes)
    content_type = content_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return web.Response(body=body, headers={hdrs.CONTENT_TYPE: content_type})


def _peer(transport: asyncio.BaseTransport | None) -> str:
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) else "an unknown peer"


def _reason(error: BaseException) -> str:
    """A client error's message on one line, cut short."""
    return " ".join(str(error).split())[:_LONGEST_REASON]


class GuardedConnection(web.RequestHandler):
    """aiohttp's HTTP connection under the module's rules: the cap when it opens, the write deadline while data
    waits for the client, client protocol errors through the throttled log."""

    __slots__ = ("_counted", "_guard", "_socket", "_write_deadline")

    def __init__(self, manager: web.Server, guard: ConnectionGuard, **options: Any) -> None:
        super().__init__(manager, **options)
        self._guard = guard
        self._socket: asyncio.Transport | None = None
        """The connection's transport, kept after aiohttp lets go of it (its close waits for unsent data)."""
        self._counted = False
        self._write_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)
        if not self._guard.admit():
            tcp.write(self._guard.busy_reply())
            tcp.close()
            self.close()  # whatever the client sends meanwhile is ignored, never parsed
            self._guard.log.note(ConnectionEvent.OVER_CAPACITY, _peer(tcp))
            return
        self._counted = True
        self._socket = tcp
        tcp.set_write_buffer_limits(high=0)  # writing pauses while any byte waits: the deadline's clock
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_write_deadline()
        self._uncount()
        super().connection_lost(exc)

    def set_parser(self, parser: Any, *args: Any, **kwargs: Any) -> None:
        """The connection became a WebSocket: ``--max-connections`` counts it from now on, not the HTTP cap."""
        super().set_parser(parser, *args, **kwargs)
        self._uncount()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_deadline = self._loop.call_later(self._guard.write_timeout_s, self._abort_unread)

    def resume_writing(self) -> None:
        self._stop_write_deadline()
        super().resume_writing()

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        error = kwargs.get("exc_info")
        if isinstance(error, ResponseCut):
            return  # logged where the response was cut
        if isinstance(error, CLIENT_PROTOCOL_ERRORS):
            self._guard.log.note(ConnectionEvent.MALFORMED_REQUEST, f"{_peer(self._socket)}: {_reason(error)}")
        else:
            super().log_exception(*args, **kwargs)

    def _abort_unread(self) -> None:
        self._write_deadline = None
        if self._socket is not None:
            self._guard.log.note(ConnectionEvent.WRITE_TIMEOUT, _peer(self._socket))
            # A reset (linger 0): a plain close would leave the kernel holding the unsent data for the client.
            tcp = self._socket.get_extra_info("socket")
            if tcp is not None:
                tcp.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_NONE)
            self._socket.abort()

    def _stop_write_deadline(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self._guard.release()


class GuardedServer(web.Server):
    """aiohttp's low-level server, making a ``GuardedConnection`` for each connection it accepts."""

    def __init__(self, plain: web.Server, guard: ConnectionGuard) -> None:
        """The server ``plain`` (the runner's), remade around the same handler and options; aiohttp keeps the
        connections' options in ``_kwargs`` and reads them nowhere else than where it makes a connection."""
        super().__init__(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            **plain._kwargs,
        )
        self.guard = guard

    def __call__(self) -> GuardedConnection:
        return GuardedConnection(self, self.guard, loop=self._loop, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """A ``web.AppRunner`` whose connections are ``GuardedConnection``s sharing ``guard``."""

    __slots__ = ("guard",)

    def __init__(self, app: web.Application, guard: ConnectionGuard, **options: Any) -> None:
        super().__init__(app, **options)
        self.guard = guard

    async def _make_server(self) -> web.Server:
        return GuardedServer(await super()._make_server(), self.guard)
