"""Request ids: ``request_id`` names each HTTP request, and ``X-Request-Id`` carries it on every response.

A client (or the proxy in front of the server) may send its own ``X-Request-Id``; it is kept when it is at most
``MAX_REQUEST_ID_CHARS`` characters from ``REQUEST_ID_PATTERN``'s set (what UUIDs, ``req_…`` ids and base64 use), so
a log line or a JSON body can show it verbatim. Anything else (too long, spaces, quotes, control characters) is never
echoed: the request gets a fresh id as if none was sent. The id is made once per request, the first time something
asks (the response's headers, an error body, the access log), and stays the same for the rest of the request.
"""

from __future__ import annotations

import re
import secrets

from aiohttp import web
from aiohttp.web_request import BaseRequest

REQUEST_ID_HEADER = "X-Request-Id"
MAX_REQUEST_ID_CHARS = 128
"""The longest client id kept: a UUID is 36 characters, OpenAI's ``req_`` ids 36; longer ones are replaced."""
REQUEST_ID_PATTERN = re.compile(rf"[A-Za-z0-9._:/+=@-]{{1,{MAX_REQUEST_ID_CHARS}}}")
"""The only shape of client id echoed: no whitespace, quotes or control characters, so it can forge no log line."""

_REQUEST_ID: web.RequestKey[str] = web.RequestKey("voxwire.request_id", str)


def request_id(request: BaseRequest) -> str:
    """The request's id: the client's ``X-Request-Id`` when it is well-formed, else a fresh one."""
    known = request.get(_REQUEST_ID)
    if known is None:
        sent = request.headers.get(REQUEST_ID_HEADER, "")
        known = sent if REQUEST_ID_PATTERN.fullmatch(sent) else new_request_id()
        request[_REQUEST_ID] = known
    return known


def new_request_id() -> str:
    """A fresh id: ``req_`` and 24 random hex digits."""
    return f"req_{secrets.token_hex(12)}"


async def add_request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: every response (errors, streams and the WebSocket 101 too) names its request."""
    response.headers[REQUEST_ID_HEADER] = request_id(request)
