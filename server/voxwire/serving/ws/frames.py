"""``StreamSocket``: aiohttp's ``WebSocketResponse`` with the two frame rules it does not enforce itself.

* Client frames must be masked (RFC 6455 section 5.1): the server closes the connection with 1002
  on an unmasked one. aiohttp's frame parser accepts both, so ``_MaskedFramesOnly`` sits in front of
  it and reads only frame headers (a few bytes per frame; payloads are skipped, never copied).
* Every close the protocol layer makes carries a reason that starts with its error code, as the
  server's own closes do: aiohttp closes with 1007 (a text frame that is not UTF-8) and 1009 (a
  message over the hard size limit) with an empty reason, so ``close`` fills one in.

This leans on two private attributes of aiohttp 3 (the request protocol's payload parser and the
response's message queue); ``tests/serving/ws/test_ws_frames.py`` pins the behaviour.
"""

from __future__ import annotations

from typing import Any

from aiohttp import WebSocketError, web
from aiohttp.web_request import BaseRequest

from voxwire.protocol.wire import CloseCode, ErrorCode

_EXTENDED_LENGTH_BYTES = {126: 2, 127: 8}
_MASK_BIT = 0x80
_MASK_BYTES = 4


class _MaskedFramesOnly:
    """Wraps aiohttp's WebSocket frame parser; fails the stream at the first unmasked frame."""

    def __init__(self, parser: Any, queue: Any) -> None:
        self._parser = parser
        self._queue = queue
        self._header = bytearray()
        self._skip = 0
        """Payload bytes of the current frame still to come."""
        self._failed = False

    def feed_eof(self) -> None:
        self._parser.feed_eof()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if self._failed:
            return True, b""
        bad_frame_at = self._first_unmasked(data)
        if bad_frame_at is None:
            result: tuple[bool, bytes] = self._parser.feed_data(data)
            return result
        if bad_frame_at:
            self._parser.feed_data(data[:bad_frame_at])  # the frames before it are handled as usual
        self._failed = True
        self._queue.set_exception(WebSocketError(CloseCode.PROTOCOL_ERROR, "an unmasked client frame"))
        return True, b""

    def _first_unmasked(self, data: bytes) -> int | None:
        """Where in ``data`` the first unmasked frame starts (0 if it started in an earlier chunk), if any."""
        position, size = 0, len(data)
        while position < size:
            if self._skip:
                step = min(self._skip, size - position)
                self._skip -= step
                position += step
                continue
            header = self._header
            frame_start = max(0, position - len(header))
            need = 2 if len(header) < 2 else 2 + _EXTENDED_LENGTH_BYTES.get(header[1] & 0x7F, 0) + _MASK_BYTES
            take = min(need - len(header), size - position)
            header += data[position : position + take]
            position += take
            if len(header) >= 2 and not header[1] & _MASK_BIT:
                return frame_start
            if len(header) == need and need > 2:
                self._skip = _payload_length(header)
                header.clear()
        return None


def _payload_length(header: bytearray) -> int:
    extended = _EXTENDED_LENGTH_BYTES.get(header[1] & 0x7F)
    if extended is None:
        return header[1] & 0x7F
    return int.from_bytes(header[2 : 2 + extended], "big")


class StreamSocket(web.WebSocketResponse):
    """See the module docstring. ``max_message_bytes`` names the soft limit in the 1009 reason."""

    def __init__(self, *, max_message_bytes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._reasons = {
            CloseCode.PROTOCOL_ERROR: f"{ErrorCode.PROTOCOL_ERROR.value}: a frame that breaks RFC 6455",
            CloseCode.INVALID_DATA: f"{ErrorCode.INVALID_JSON.value}: a text frame that is not UTF-8",
            CloseCode.MESSAGE_TOO_BIG: f"{ErrorCode.MESSAGE_TOO_LARGE.value}: messages are limited to "
            f"{max_message_bytes} bytes",
        }

    def _post_start(self, request: BaseRequest, protocol: str | None, writer: Any) -> None:
        # Frames that came with the upgrade request itself were parsed before this wrapper is in place;
        # a client may not send any before the server's 101, so that is only a misbehaving client's gain.
        super()._post_start(request, protocol, writer)
        handler = request.protocol
        handler._payload_parser = _MaskedFramesOnly(handler._payload_parser, self._reader)

    async def close(self, *, code: int = CloseCode.NORMAL, message: bytes = b"", drain: bool = True) -> bool:
        if not message and code in self._reasons:
            message = self._reasons[CloseCode(code)].encode()
        return await super().close(code=code, message=message, drain=drain)
