"""Typed application keys: how handlers (HTTP and WebSocket) find the server's shared objects.

Everything a handler needs lives on the ``web.Application`` under one of these keys, set by
``voxstream.serving.app.make_app``; nothing is module-global. Read them with ``request.app[KEY]``.

* ``SERVICE_KEY``: the ``SpeechService`` (model, engine, voice encoding).
* ``CONFIG_KEY``: the ``ServerConfig`` (limits, timeouts, auth settings).
* ``VOICES_KEY``: the ``VoiceStore`` (saved voices by id).
* ``METRICS_KEY``: the ``Metrics`` (Prometheus instruments of this app).
* ``STATE_KEY``: the ``ServerState``; handlers refuse new sessions and utterances unless
  ``state.accepting`` (it is false while the model warms up and once shutdown has begun).
* ``SESSIONS_KEY``: the live WebSocket responses. A WebSocket handler adds its response after
  ``prepare()`` and discards it in ``finally``; on shutdown the app waits for live utterances to
  finish (up to ``ServerConfig.drain_timeout_s``) and then closes every socket left here with 1001.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from voxstream.serving.config import ServerConfig
    from voxstream.serving.metrics import Metrics
    from voxstream.serving.service import SpeechService
    from voxstream.serving.voices import VoiceStore


class Phase(enum.Enum):
    """Where the server is in its life: only ``READY`` accepts new work."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


@dataclass
class ServerState:
    """The mutable lifecycle flag shared by the handlers and the app's startup/shutdown context."""

    phase: Phase = Phase.STARTING

    @property
    def accepting(self) -> bool:
        return self.phase is Phase.READY


SERVICE_KEY: web.AppKey[SpeechService] = web.AppKey("voxstream.service")
CONFIG_KEY: web.AppKey[ServerConfig] = web.AppKey("voxstream.config")
VOICES_KEY: web.AppKey[VoiceStore] = web.AppKey("voxstream.voices")
METRICS_KEY: web.AppKey[Metrics] = web.AppKey("voxstream.metrics")
STATE_KEY: web.AppKey[ServerState] = web.AppKey("voxstream.state")
SESSIONS_KEY: web.AppKey[set[web.WebSocketResponse]] = web.AppKey("voxstream.sessions")
