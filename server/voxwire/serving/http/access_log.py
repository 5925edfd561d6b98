"""``AccessLogger``: one line per HTTP request, with the query string withheld.

Browsers send their API key as ``?token=<key>`` (their WebSocket API cannot set headers), so a
request line or a ``Referer`` copied into a log would leak it to whoever reads the logs. The line
keeps the path and says whether a query was there (``?<redacted>``), never its content. It ends with the request's
id (``X-Request-Id``), so a client's report or an error body leads to its line.
"""

from __future__ import annotations

import logging

from aiohttp import hdrs
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from voxwire.serving.edge.request_id import request_id

ACCESS_LOGGER = logging.getLogger("voxwire.access")


def without_query(target: str) -> str:
    """``target`` (a path or URL) with any query string and fragment replaced by ``?<redacted>``."""
    path, query_mark, _ = target.partition("?")
    path = path.partition("#")[0]
    return f"{path}?<redacted>" if query_mark else path


class AccessLogger(AbstractAccessLogger):
    """``remote "METHOD path HTTP/x.y" status bytes seconds "referer-path" "user-agent" request-id``, query-free."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        version = f"{request.version.major}.{request.version.minor}"
        referer = without_query(request.headers.get(hdrs.REFERER, "-"))
        self.logger.info(
            '%s "%s %s HTTP/%s" %d %d %.3f "%s" "%s" %s',
            request.remote or "-",
            request.method,
            without_query(request.raw_path),
            version,
            response.status,
            response.body_length,
            time,
            referer,
            request.headers.get(hdrs.USER_AGENT, "-"),
            request_id(request),
        )
