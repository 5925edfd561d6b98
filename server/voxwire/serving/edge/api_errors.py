"""The HTTP error envelope: ``ApiError`` and ``error_middleware``, the one place errors leave the server.

Every error leaves as ``{"error": {"code": ..., "message": ..., "request_id": ...}}``, produced here from an
``ApiError`` or a known library exception; ``request_id`` is the response's ``X-Request-Id`` (``request_id``). The
codes are stable and shared with the WebSocket protocol: ``protocol.error_codes.ErrorCode`` lists them with each
one's HTTP status. A client that leaves (mid-body or mid-stream) is counted as a dropped session and logged at INFO:
it is not a server error.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from voxwire.engine import EngineDeadError, EngineRestartingError, QueueFullError
from voxwire.errors import InvalidInputError
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.error_envelope import RETRY_AFTER_S as RETRY_AFTER_S
from voxwire.serving.edge.error_envelope import ApiError as ApiError
from voxwire.serving.edge.request_id import request_id
from voxwire.serving.runtime.keys import (
    METRICS_KEY,
)
from voxwire.serving.speech.persona_names import PersonaLoadError, PersonaOwnerError, UnknownPersonaError
from voxwire.serving.speech.service import SpeechFailure
from voxwire.serving.speech.voice_store import UnknownVoiceError, VoiceLimitError, VoiceOwnerError

logger = logging.getLogger(__name__)


class ResponseCut(Exception):
    """A handler cut its streaming response short on purpose (an utterance that failed mid-body): it logged why and
    aborted the connection, so that no client takes the body for a whole one. The error envelope lets it pass (the
    response has begun), the request's span and metrics count it as failed, and the connection does not log it
    again (``connections``)."""


_KEPT_HEADERS = frozenset({hdrs.ALLOW, hdrs.RETRY_AFTER})


_AIOHTTP_CODES = (
    ErrorCode.INVALID_REQUEST,
    ErrorCode.NOT_FOUND,
    ErrorCode.METHOD_NOT_ALLOWED,
    ErrorCode.PAYLOAD_TOO_LARGE,
)


_HTTP_CODES = {code.http_status: code for code in _AIOHTTP_CODES}
"""The code of each aiohttp HTTP error the server can raise (an unknown route, a method, a body over the limit)."""


def as_api_error(exc: Exception) -> ApiError | None:
    """The client-facing form of an exception a handler may raise; None for a server bug."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, UnknownVoiceError):
        return ApiError(ErrorCode.UNKNOWN_VOICE, str(exc))
    if isinstance(exc, VoiceLimitError):
        return ApiError(ErrorCode.VOICE_LIMIT, str(exc))
    if isinstance(exc, (VoiceOwnerError, PersonaOwnerError)):
        return ApiError(ErrorCode.FORBIDDEN, str(exc))
    if isinstance(exc, UnknownPersonaError):
        return ApiError(ErrorCode.UNKNOWN_PERSONA, str(exc))
    if isinstance(exc, PersonaLoadError):
        return ApiError(ErrorCode(exc.code), str(exc))
    if isinstance(exc, SpeechFailure):
        retryable = exc.code in (ErrorCode.BUSY, ErrorCode.ENGINE_RESTARTED)
        retry: dict[str, str] | None = {hdrs.RETRY_AFTER: str(RETRY_AFTER_S)} if retryable else None
        return ApiError(exc.code, str(exc), headers=retry)
    if isinstance(exc, QueueFullError):  # an engine's bounded work (its voice encoder) is full
        return ApiError(ErrorCode.BUSY, str(exc), headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_S)})
    if isinstance(exc, InvalidInputError):
        return ApiError(ErrorCode.INVALID_PARAMETER, str(exc))
    if isinstance(exc, EngineDeadError):  # a voice or persona call to an engine that died (restarting, or stopped)
        code = ErrorCode.ENGINE_RESTARTED if isinstance(exc, EngineRestartingError) else ErrorCode.UNAVAILABLE
        return ApiError(code, str(exc), headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_S)})
    if isinstance(exc, (web.RequestPayloadError, HttpProcessingError)):
        # A body its Content-Encoding or chunked framing cannot decode, a multipart part's malformed headers.
        reason = str(exc).splitlines()[-1].strip()  # aiohttp's message begins "400, message:"
        return ApiError(ErrorCode.INVALID_REQUEST, f"the request body cannot be read: {reason}", close_connection=True)
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        # Another status (none the server raises today) keeps its status under the generic code of its class.
        generic = ErrorCode.INVALID_REQUEST if exc.status < 500 else ErrorCode.INTERNAL_ERROR
        code = _HTTP_CODES.get(exc.status, generic)
        kept = {name: value for name, value in exc.headers.items() if name in _KEPT_HEADERS}  # e.g. 405's Allow
        return ApiError(code, exc.reason, status=exc.status, headers=kept)
    return None


CLIENT_CLOSED_STATUS = 499
"""Status logged for a request whose client left before the response (nothing reaches the client)."""


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into the JSON error envelope, and count it by code (``not_found``, a path that does
    not exist, is counted with the HTTP requests instead: ``route="unmatched"`` or a demo file's 404)."""
    try:
        return await handler(request)
    except asyncio.CancelledError:
        # aiohttp may cancel the handler when its client leaves mid-body, instead of failing the read (which
        # happens depends on timing and on what else patched asyncio in the process): the same departure.
        if _client_gone(request):
            _count_departure(request, "cancelled")
        raise
    except Exception as exc:
        if isinstance(exc, ConnectionError) and _client_gone(request):
            _count_departure(request, exc)
            return web.Response(status=CLIENT_CLOSED_STATUS)
        error = as_api_error(exc)
        if request.writer is not None and request.writer.output_size > 0:
            raise  # the response has begun: aiohttp can only cut the connection, which tells the client
        if error is None:
            logger.exception("unexpected error in %s %s", request.method, request.path)
            error = ApiError(ErrorCode.INTERNAL_ERROR, "the server failed to handle this request; see its log")
        if error.code is not ErrorCode.NOT_FOUND:  # a path that does not exist (a scanner's probe) is no error
            request.app[METRICS_KEY].count_error(error.code.value)
        return error.response(request_id(request))


def _count_departure(request: web.Request, cause: object) -> None:
    logger.info("client left during %s %s: %s", request.method, request.path, cause)
    if request.writer is None or request.writer.output_size == 0:  # a stream counts its own drop
        request.app[METRICS_KEY].count_dropped("client_disconnected")


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()
