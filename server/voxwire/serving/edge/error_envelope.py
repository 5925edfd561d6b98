"""``ApiError``: an error for the client, in the envelope every error leaves the server in (``api_errors``).

Apart from ``api_errors`` (which imports the engine's and the speech service's errors to translate them), so that
what answers before the model's code is loaded (``serving.boot``) can use it without importing that code.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from voxwire.protocol.error_codes import ErrorCode
from voxwire.startup import Readiness

RETRY_AFTER_S = 1
"""Seconds a refused client should wait before trying again (a balancer retries another replica at once)."""


class ApiError(Exception):
    """An error for the client: stable code (which states the HTTP status), human message (and optional headers).

    ``status`` overrides the code's status only where an API answers otherwise: an aiohttp HTTP error with no
    code of its own, and the Nano-vLLM API's 400 for every LoRA refusal.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        close_connection: bool = False,
    ) -> None:
        super().__init__(message)
        status = status or code.http_status
        if status is None:
            raise ValueError(f"{code.value!r} is a WebSocket-only error code; it has no HTTP status")
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.close_connection = close_connection
        """The connection cannot carry another request (e.g. a body was left half-read): close it after this."""

    def body(self, request_id: str) -> dict[str, dict[str, str]]:
        """The error envelope; ``request_id`` names the request (its ``X-Request-Id``)."""
        return {"error": {"code": self.code.value, "message": self.message, "request_id": request_id}}

    def response(self, request_id: str) -> web.Response:
        """The JSON error response; ``request_id`` names the request (its ``X-Request-Id``)."""
        response = web.json_response(self.body(request_id), status=self.status, headers=self.headers)
        if self.close_connection:
            response.force_close()
        return response


def not_ready_answer(refused: ApiError, phase: Readiness, made_id: str) -> web.Response:
    """``/ready``'s 503: the error envelope of ``refused``, with ``status`` (``starting``, ``draining`` or
    ``restarting``: an engine is being replaced) and the ``phase`` (``startup.Readiness``) beside it."""
    if phase is Readiness.DRAINING:
        status = "draining"
    elif phase is Readiness.READY:
        status = "restarting"
    else:
        status = "starting"
    body = {"status": status, "phase": phase.value, **refused.body(made_id)}
    return web.json_response(body, status=refused.status, headers=refused.headers)
