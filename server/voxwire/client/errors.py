"""Typed client errors; each carries the process exit code the command line returns for it."""

from __future__ import annotations

from voxwire.errors import VoxwireError


class ClientError(VoxwireError):
    """A client-side failure; ``exit_code`` is what ``voxwire say``/``bench`` exit with."""

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


class ServerBusyError(ClientError):
    """The server (or every replica behind its balancer) refused the connection for now: HTTP 502/503/504 on
    the upgrade, or a ``busy``/``unavailable`` refusal closed with 1013. Worth retrying after ``retry_after_s``."""

    exit_code = 7

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ConnectionLostError(ServerError):
    """The connection ended mid-session without the server finishing: 1001 (the server went away, e.g. a drain
    that ran out of time) or 1006 (the connection broke: a killed replica, a network fault). ``code`` is
    ``going_away`` or ``connection_lost``; the utterance in progress is cut short."""

    exit_code = 6

    def __init__(self, code: str, message: str, close_code: int) -> None:
        super().__init__(code, message)
        self.close_code = close_code
