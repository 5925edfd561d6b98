"""Typed client errors; each carries the process exit code the command line returns for it."""

from __future__ import annotations

from voxstream.errors import VoxstreamError


class ClientError(VoxstreamError):
    """A client-side failure; ``exit_code`` is what ``voxstream say``/``bench`` exit with."""

    exit_code = 1


class OutputUnavailableError(ClientError):
    """Nowhere to put the audio (no speakers and stdout is a terminal)."""

    exit_code = 2


class ServerUnreachableError(ClientError):
    """No connection: wrong address, the server is down, or the handshake timed out."""

    exit_code = 3


class AuthenticationError(ClientError):
    """The server refused the API key (HTTP 401/403 on the WebSocket upgrade)."""

    exit_code = 4


class ServerError(ClientError):
    """The server sent an ``error`` message or closed the connection; ``code`` is its stable ``ErrorCode``."""

    exit_code = 5

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"server error {code}: {message}")
        self.code = code
        self.message = message
