"""Access control: API keys on every endpoint but the probes, and the Origin check on WebSocket upgrades.

One middleware covers every route, the WebSocket endpoint included, so handlers never check keys
themselves. A key comes as ``Authorization: Bearer <key>`` or, for browsers (whose WebSocket API
cannot set headers), as a ``token`` query parameter; it is compared with every configured key in
constant time. The Origin check applies only to WebSocket upgrades, which browsers make without a
CORS preflight; a request without an ``Origin`` header (not from a browser) is not refused by it.
"""

from __future__ import annotations

import hmac

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from voxstream.serving.http_api import ApiError
from voxstream.serving.keys import CONFIG_KEY

OPEN_PATHS = frozenset({"/health", "/ready"})
"""Probes that load balancers and orchestrators call without credentials."""
DEMO_PAGE = "/"
DEMO_FILES_PREFIX = "/client/"
"""The demo page and its static modules: public (they hold no secrets); the API they call needs the key."""


def is_public(request: web.Request) -> bool:
    if request.path in OPEN_PATHS:
        return True
    static = request.path == DEMO_PAGE or request.path.startswith(DEMO_FILES_PREFIX)
    return static and request.method in (hdrs.METH_GET, hdrs.METH_HEAD)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[CONFIG_KEY]
    if config.api_keys and not is_public(request):
        check_api_key(request, config.api_keys)
    if config.allowed_origins and is_websocket_upgrade(request):
        check_origin(request, config.allowed_origins)
    return await handler(request)


def check_api_key(request: web.Request, api_keys: tuple[str, ...]) -> None:
    """Raise ``ApiError`` 401 unless the request carries one of ``api_keys``."""
    presented = _presented_key(request)
    if presented is None:
        raise _unauthorized("an API key is required: send 'Authorization: Bearer <key>' or a 'token' query parameter")
    # Compare with every key, without stopping at a match, so timing says nothing about which one matched.
    matched = False
    for key in api_keys:
        matched |= hmac.compare_digest(presented.encode(), key.encode())
    if not matched:
        raise _unauthorized("the API key is not valid")


def check_origin(request: web.Request, allowed_origins: tuple[str, ...]) -> None:
    """Raise ``ApiError`` 403 if the request comes from a browser page whose origin is not allowed."""
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is not None and origin.lower() not in {allowed.lower() for allowed in allowed_origins}:
        raise ApiError(403, "forbidden_origin", f"origin {origin!r} may not open a WebSocket on this server")


def is_websocket_upgrade(request: web.Request) -> bool:
    return request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"


def _presented_key(request: web.Request) -> str | None:
    header = request.headers.get(hdrs.AUTHORIZATION)
    if header is not None:
        scheme, _, key = header.partition(" ")
        return key.strip() if scheme.lower() == "bearer" and key.strip() else None
    return request.query.get("token") or None


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={hdrs.WWW_AUTHENTICATE: "Bearer"})
