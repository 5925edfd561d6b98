"""Admission of new work on this replica, asked before any response has begun.

A load balancer can retry a refused request on another replica (nginx ``proxy_next_upstream
http_503``, HAProxy ``retry-on 503``) but cannot retry a WebSocket it has already upgraded: the
stream endpoint and ``POST /v1/audio/speech`` therefore ask ``refusal`` before the 101 or the first
byte of audio, and ``require_admission`` turns a refusal into HTTP 503 with ``Retry-After``.
A replica refuses while it warms up or drains, while its engine is being replaced after a failure, when its
WebSocket connections are at ``max_connections`` (new connections only), and when its engine queue is full
(``max_waiting``). A connection upgraded without an API key (it may send it in its first message) counts against
``max_keyless_connections`` instead, and must pass the same rule as a keyed one once its key comes.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import hdrs, web

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import RETRY_AFTER_S, ApiError
from voxwire.serving.runtime.keys import CONFIG_KEY, ENGINES_KEY, KEYLESS_KEY, SESSIONS_KEY, STATE_KEY, Phase
from voxwire.startup import Readiness


@dataclass(frozen=True)
class Refusal:
    """Why new work cannot start here now: a stable error code and a message for people."""

    code: ErrorCode
    message: str


ENGINE_RESTARTING = Refusal(ErrorCode.ENGINE_RESTARTED, "the engine is restarting after a failure, retry shortly")


def refusal(app: web.Application, *, connection: bool, keyless: bool = False) -> Refusal | None:
    """Why new work cannot start on this replica now; None when it can.

    ``connection``: the work is a new WebSocket connection, which also counts against ``max_connections``;
    ``keyless``: one that has not shown its API key yet, which counts against ``max_keyless_connections`` instead
    (so that clients without a key cannot take the places of those with one).
    """
    config, state = app[CONFIG_KEY], app[STATE_KEY]
    limits = config.limits
    phase = state.phase
    if phase is Phase.STARTING:
        return Refusal(ErrorCode.NOT_READY, "the model is warming up, retry shortly")
    if phase is Phase.DRAINING:
        return Refusal(ErrorCode.SHUTTING_DOWN, "the server is shutting down, retry on another replica")
    if not app[ENGINES_KEY].available:
        return ENGINE_RESTARTING
    if connection and keyless:
        if len(app[KEYLESS_KEY]) >= limits.max_keyless_connections:
            text = f"the server has its maximum of {limits.max_keyless_connections} connections waiting for their key"
            return Refusal(ErrorCode.BUSY, text)
    elif connection and len(app[SESSIONS_KEY]) + state.seats.others() >= limits.max_connections:
        return Refusal(ErrorCode.BUSY, f"the server has its maximum of {limits.max_connections} connections")
    if app[ENGINES_KEY].queue_full:
        return Refusal(ErrorCode.BUSY, f"the engine queue is full ({config.engine.max_waiting} waiting)")
    return None


def require_accepting(app: web.Application) -> None:
    """Raise 503 unless the server takes new work (warmed up, not shutting down)."""
    phase = app[STATE_KEY].phase
    if phase is Phase.STARTING:
        raise ApiError(ErrorCode.NOT_READY, "the model is warming up, retry shortly", headers={"Retry-After": "1"})
    if phase is Phase.DRAINING:
        raise ApiError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
    if not app[ENGINES_KEY].available:
        raise ApiError(ENGINE_RESTARTING.code, ENGINE_RESTARTING.message, headers={"Retry-After": str(RETRY_AFTER_S)})


def readiness(app: web.Application) -> Readiness:
    """The phase ``/ready`` names: a server that exists has loaded its model, so its start is the warm-up."""
    return {Phase.STARTING: Readiness.WARMING_UP, Phase.READY: Readiness.READY, Phase.DRAINING: Readiness.DRAINING}[
        app[STATE_KEY].phase
    ]


def require_admission(app: web.Application, *, connection: bool, keyless: bool = False) -> None:
    """Raise 503 with ``Retry-After`` unless this replica takes new work now (see ``admission.refusal``)."""
    refused = refusal(app, connection=connection, keyless=keyless)
    if refused is not None:
        raise ApiError(refused.code, refused.message, headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_S)})
