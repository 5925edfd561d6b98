"""A speech request's priority (``engine.Priority``): the body's ``priority`` field, else the ``Voxwire-Priority``
header (for clients that cannot add a field, e.g. an SDK with a fixed body), else real-time.

What a priority means is the engine's rule (``engine.policy``, B1-B4): ``batch`` runs only in the capacity the
real-time requests leave, and never starves.
"""

from __future__ import annotations

from aiohttp import web

from voxwire.engine import Priority
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import ApiError

PRIORITY_HEADER = "Voxwire-Priority"
PRIORITY_CHOICES = tuple(priority.value for priority in Priority)
PRIORITY_DESCRIPTION = (
    "realtime (default): someone is listening; batch: an offline job that runs only in the capacity real-time "
    f"requests leave, and never starves. Also settable by the {PRIORITY_HEADER} header."
)


def request_priority(request: web.Request, field: Priority | None) -> Priority:
    """The priority of a speech request whose body's ``priority`` field is ``field`` (None: absent).

    Raises:
        ApiError: ``invalid_parameter``, the header names no priority.
    """
    if field is not None:
        return field
    header = request.headers.get(PRIORITY_HEADER)
    if header is None:
        return Priority.REALTIME
    try:
        return Priority(header.strip().lower())
    except ValueError:
        raise ApiError(
            ErrorCode.INVALID_PARAMETER,
            f"header {PRIORITY_HEADER}: {header!r} is not a priority; use one of {', '.join(PRIORITY_CHOICES)}",
        ) from None
