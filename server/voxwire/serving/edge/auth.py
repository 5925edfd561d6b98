"""Access control: API keys on every endpoint but the probes, and the Origin rule with its CORS answers.

One middleware covers every route, the WebSocket endpoint included, so handlers never check keys
themselves. A key comes as ``Authorization: Bearer <key>``, as ElevenLabs' clients send it (``xi-api-key``),
or, for browsers (whose WebSocket API cannot set headers), as a ``token`` query parameter; it is compared
with every configured key in constant time, and the request remembers a digest of it (``OWNER_KEY``: who
made a voice). A handler marked ``key_in_first_message`` (the ElevenLabs endpoints, whose clients may send
the key in their first message instead) is let through without one, and checks it itself (``key_matches``).

With ``allowed_origins`` configured, a request that carries an ``Origin`` header (a browser page)
from another origin is refused with 403 on every endpoint but the probes and the demo files: the
WebSocket upgrade, which browsers make without a CORS preflight, and the HTTP API, which a page can
reach with a "simple" cross-origin POST (``text/plain`` JSON, a form) that needs no preflight
either. An allowed origin gets proper CORS answers: preflights (``OPTIONS``) are answered before the
key check (browsers send them without credentials), and responses name the origin. Without
``allowed_origins`` every origin may call, and no CORS header is sent. A request without ``Origin``
(not from a browser) is never refused by the origin rule.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TypeVar

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.runtime.keys import CONFIG_KEY, OWNER_KEY

OPEN_PATHS = frozenset({"/health", "/ready"})
"""Probes that load balancers and orchestrators call without credentials."""
DEMO_PAGE = "/"
DEMO_FILES_PREFIX = "/client/"
DEMO_FILE_SUFFIXES = frozenset({".js", ".css", ".html", ".png"})
"""The demo page and its static modules: public (they hold no secrets); the API they call needs the key."""
OPENAPI_PATH = "/openapi.json"
DOCS_PATH = "/docs"
"""The API's description and the page that shows it: public, as the demo files (no secrets: the routes and the
limits its error messages state anyway)."""


def is_public(request: web.Request) -> bool:
    if request.path in OPEN_PATHS:
        return True
    static = request.path in (DEMO_PAGE, OPENAPI_PATH, DOCS_PATH) or request.path.startswith(DEMO_FILES_PREFIX)
    return static and request.method in (hdrs.METH_GET, hdrs.METH_HEAD)


XI_API_KEY_HEADER = "xi-api-key"
"""The header ElevenLabs' clients carry their key in."""

_KEY_IN_FIRST_MESSAGE = "_voxwire_key_in_first_message"

_H = TypeVar("_H", bound=Handler)


def key_in_first_message(handler: _H) -> _H:
    """Mark a WebSocket handler whose clients may send their key in their first message: without a key in the
    request, it is let through (with no owner) and must refuse every message until ``key_matches`` accepts one."""
    setattr(handler, _KEY_IN_FIRST_MESSAGE, True)
    return handler


_CORS_ORIGIN: web.RequestKey[str] = web.RequestKey("voxwire.cors_origin", str)

CORS_MAX_AGE_S = 600
"""How long a browser may cache a preflight answer."""
_CORS_METHODS = "GET, POST, DELETE"
_CORS_HEADERS = "Authorization, xi-api-key, Content-Type, X-Request-Id, Voxwire-Priority, traceparent, tracestate"
_CORS_EXPOSED = "Retry-After, X-Request-Id, X-Voxwire-Ignored-Fields"


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[CONFIG_KEY]
    if is_public(request):
        return await handler(request)
    origin = request.headers.get(hdrs.ORIGIN)
    if config.transport.allowed_origins and origin is not None:
        check_origin(origin, config.transport.allowed_origins)
        if _is_preflight(request):
            return _preflight(origin)
        request[_CORS_ORIGIN] = origin
    if config.transport.api_keys and _presented_key(request) is None and _checks_key_itself(request):
        request[OWNER_KEY] = None
        return await handler(request)
    request[OWNER_KEY] = (
        key_owner(check_api_key(request, config.transport.api_keys)) if config.transport.api_keys else None
    )
    return await handler(request)


def _checks_key_itself(request: web.Request) -> bool:
    return getattr(request.match_info.handler, _KEY_IN_FIRST_MESSAGE, False) is True


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: name the allowed origin on every response to it (streamed ones too)."""
    origin = request.get(_CORS_ORIGIN)
    if origin is not None:
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
        response.headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = _CORS_EXPOSED
        response.headers.add(hdrs.VARY, hdrs.ORIGIN)


def check_api_key(request: web.Request, api_keys: tuple[str, ...]) -> str:
    """The key the request carries; raise ``ApiError`` 401 unless it is one of ``api_keys``."""
    presented = _presented_key(request)
    if presented is None:
        raise _unauthorized("an API key is required: send 'Authorization: Bearer <key>' or a 'token' query parameter")
    if not key_matches(presented, api_keys):
        raise _unauthorized("the API key is not valid")
    return presented


def key_matches(presented: str, api_keys: tuple[str, ...]) -> bool:
    """Whether ``presented`` is one of ``api_keys``."""
    # Compare with every key, without stopping at a match, so timing says nothing about which one matched.
    matched = False
    for key in api_keys:
        matched |= hmac.compare_digest(presented.encode(), key.encode())
    return matched


def key_owner(key: str) -> str:
    """A stable, non-reversible name for an API key (stored with the voices it makes; never the key itself)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def check_origin(origin: str, allowed_origins: tuple[str, ...]) -> None:
    """Raise ``ApiError`` 403 unless ``origin`` (a browser page's) is allowed."""
    if origin.lower() not in {allowed.lower() for allowed in allowed_origins}:
        raise ApiError(ErrorCode.FORBIDDEN_ORIGIN, f"pages from origin {origin!r} may not use this server")


def _is_preflight(request: web.Request) -> bool:
    return request.method == hdrs.METH_OPTIONS and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers


def _preflight(origin: str) -> web.Response:
    return web.Response(
        status=204,
        headers={
            hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: origin,
            hdrs.ACCESS_CONTROL_ALLOW_METHODS: _CORS_METHODS,
            hdrs.ACCESS_CONTROL_ALLOW_HEADERS: _CORS_HEADERS,
            hdrs.ACCESS_CONTROL_MAX_AGE: str(CORS_MAX_AGE_S),
            hdrs.VARY: hdrs.ORIGIN,
        },
    )


def _presented_key(request: web.Request) -> str | None:
    header = request.headers.get(hdrs.AUTHORIZATION)
    if header is not None:
        scheme, _, key = header.partition(" ")
        return key.strip() if scheme.lower() == "bearer" and key.strip() else None
    return request.headers.get(XI_API_KEY_HEADER) or request.query.get("token") or None


def _unauthorized(message: str) -> ApiError:
    return ApiError(ErrorCode.UNAUTHORIZED, message, headers={hdrs.WWW_AUTHENTICATE: "Bearer"})
