"""Typed application keys: how handlers (HTTP and WebSocket) find the server's shared objects.

Everything a handler needs lives on the ``web.Application`` under one of these keys, set by
``voxwire.serving.app.make_app``; nothing is module-global. Read them with ``request.app[KEY]``.

* ``SPEAKER_KEY``: the ``Speaker`` the handlers speak and encode voices through (``service``): each utterance on
  the freest engine. A WebSocket connection takes its own, pinned to one engine (``ENGINES_KEY``'s ``pinned()``).
* ``ENGINES_KEY``: the ``Engines`` (``service``): their start and stop, their load for admission and metrics.
* ``CONFIG_KEY``: the ``ServerConfig`` (limits, timeouts, auth settings).
* ``VOICES_KEY``: the ``VoiceStore`` (saved voices by id).
* ``INLINE_VOICES_KEY``: the ``InlineVoices`` (voices encoded from clips that requests carry, by the clip).
* ``METRICS_KEY``: the ``Metrics`` (Prometheus instruments of this app).
* ``STATE_KEY``: the ``ServerState``; handlers refuse new sessions and utterances unless
  ``state.accepting`` (it is false while the model warms up and once shutdown has begun), and
  run each utterance inside ``with state.utterance():`` so that shutdown can wait for it.
* ``OWNER_KEY`` (on the request, not the app): who is asking, see below.
* ``ENCODERS_KEY``: the ``EncoderPool`` (threads that run the audio encoders).
* ``SESSIONS_KEY``: the live WebSocket responses. A WebSocket handler adds its response after
  ``prepare()`` and discards it in ``finally``; on shutdown the app waits for live utterances to
  finish (up to ``ServerConfig.limits.drain_timeout_s``) and then closes every socket left here with 1001.
* ``KEYLESS_KEY``: the live WebSocket responses upgraded without an API key that have not sent one yet (the
  ElevenLabs endpoints take it in the first message): bounded by ``max_keyless_connections``, not counted in
  ``SESSIONS_KEY`` until their key is accepted, and closed with 1001 on shutdown as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from voxwire.serving.runtime.timeouts import within

if TYPE_CHECKING:
    from voxwire.serving.runtime.encoding import EncoderPool
    from voxwire.serving.runtime.metrics import Metrics
    from voxwire.serving.runtime.tracing import Tracing
    from voxwire.serving.server_config import ServerConfig
    from voxwire.serving.speech.inline_voices import InlineVoices
    from voxwire.serving.speech.service import Engines, Speaker
    from voxwire.serving.speech.voice_store import VoiceStore


class Phase(enum.Enum):
    """Where the server is in its life: only ``READY`` accepts new work."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


class Seats(Protocol):
    """The server's WebSocket connections, counted across its processes, so that ``max_connections`` bounds the
    server, not each frontend (``--workers``). ``OneProcess`` is the single process's."""

    def others(self) -> int:
        """Connections the server's other processes hold now."""
        ...

    def taking(self) -> contextlib.AbstractContextManager[None]:
        """Hold while checking the count, adding a connection and publishing the new count: no other process
        checks meanwhile, so a burst of upgrades over every process cannot pass the bound."""
        ...

    def publish(self, held: int) -> None:
        """This process holds ``held`` connections now."""
        ...


class OneProcess:
    """``Seats`` of a server that is one process: nobody else holds connections."""

    def others(self) -> int:
        return 0

    def taking(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def publish(self, held: int) -> None:
        pass


@dataclass
class ServerState:
    """Lifecycle shared by the handlers and the app's startup/shutdown: the phase and the live utterances."""

    phase: Phase = Phase.STARTING
    live_utterances: int = 0
    """Utterances being spoken (HTTP requests, WebSocket utterances from first text to ``done``)."""
    voice_jobs: int = 0
    """Voice clips being decoded and encoded now (``voice_job``): uploads, ``/encode_latents``, ``/generate``'s
    wav prompts (``http.clips.encode_clip``)."""
    seats: Seats = field(default_factory=OneProcess)
    """The WebSocket connections of the server's other processes, and how this one takes a seat among them
    (``--workers``: ``workers.liveness.Pulse``)."""
    stop: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set to stop the server (a signal, a frontend told its service ended, a fatal engine failure): it drains
    and closes (``app.run_app``)."""
    exit_status: int = 0
    """What the server's process exits with once stopped: 1 after a failure it could not recover from."""
    drain: asyncio.Task[None] | None = field(default=None, repr=False)
    """The server's one drain (``app.drain``) once begun: whoever asks for the shutdown later waits for it."""
    _idle: asyncio.Event = field(default_factory=_set_event, repr=False)

    @property
    def accepting(self) -> bool:
        return self.phase is Phase.READY

    @contextlib.contextmanager
    def utterance(self) -> Iterator[None]:
        """Count one live utterance for as long as the block runs."""
        self.live_utterances += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.live_utterances -= 1
            if self.live_utterances == 0:
                self._idle.set()

    @contextlib.contextmanager
    def voice_job(self) -> Iterator[None]:
        """Count one voice clip being decoded and encoded for as long as the block runs."""
        self.voice_jobs += 1
        try:
            yield
        finally:
            self.voice_jobs -= 1

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no utterance is live, at most ``timeout`` seconds; whether it got there."""
        try:
            await within(self._idle.wait(), timeout)
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            return False
        return True


SPEAKER_KEY: web.AppKey[Speaker] = web.AppKey("voxwire.speaker")
ENGINES_KEY: web.AppKey[Engines] = web.AppKey("voxwire.engines")
CONFIG_KEY: web.AppKey[ServerConfig] = web.AppKey("voxwire.model_config")
VOICES_KEY: web.AppKey[VoiceStore] = web.AppKey("voxwire.voices")
INLINE_VOICES_KEY: web.AppKey[InlineVoices] = web.AppKey("voxwire.inline_voices")
METRICS_KEY: web.AppKey[Metrics] = web.AppKey("voxwire.metrics")
STATE_KEY: web.AppKey[ServerState] = web.AppKey("voxwire.state")
SESSIONS_KEY: web.AppKey[set[web.WebSocketResponse]] = web.AppKey("voxwire.sessions")
KEYLESS_KEY: web.AppKey[set[web.WebSocketResponse]] = web.AppKey("voxwire.keyless_sessions")
OWNER_KEY = web.RequestKey[str | None]("voxwire.owner")
"""Per request (set by ``auth.auth_middleware``): the digest of the API key used (``auth.key_owner``), or None
when authentication is off; voices remember it to tell who may delete them."""
ENCODERS_KEY: web.AppKey[EncoderPool] = web.AppKey("voxwire.encoders")
TRACING_KEY: web.AppKey[Tracing | None] = web.AppKey("voxwire.tracing")
"""The server's tracing (``tracing_from_environment``); None when traces are off."""
