"""``EngineProxy``: a frontend process's ``Engines`` and ``Speaker``, speaking to the engine processes over ZeroMQ.

It implements the same contracts as ``SpeechService`` (``service.Engines``, ``service.Speaker``), so the handlers,
sessions and encoders of a frontend are the single-process server's, unchanged. It routes requests and keeps
their streams; the links to the engines (sockets, readers, an engine's loss and its successor, utility calls and
the hub) are ``links.EngineLinks``, which tell the proxy what concerns streams (``LinkListener``). An ``Outputs``
message carries a whole step's outputs for this frontend's requests on that engine, fanned out to their streams
by ``OutputStreams``.

Each new utterance goes to the engine with the most free capacity (``EngineLinks.freest``); a WebSocket
connection's later utterances stay on the engine of its first (``PinnedSpeaker``). A clip is encoded on the
engine with the most free capacity; the encoded prompt travels with each request to whichever engine speaks it
(and is cached on that engine's device). One engine's death fails that engine's streams with ``unavailable``
and nothing else: new utterances go to the engines left, and a connection pinned to it moves to the freest at
its next utterance.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import AsyncGenerator, Sequence

from voxwire.engine import Chunk, EngineRestartingError, EngineStats, Request
from voxwire.engine.streams import OutputStreams
from voxwire.prompt import VoicePrompt
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.service import EngineSpeaker, Speaker, engine_queue_full
from voxwire.serving.workers import ipc
from voxwire.serving.workers.links import EngineLink, EngineLinks, LinkState
from voxwire.voice_clip import VoiceClip

logger = logging.getLogger(__name__)

STOPPED = "the engine is stopped"


class EngineProxy(EngineSpeaker):
    """The engine processes, seen from one frontend. Build it with ``await EngineProxy.connect(...)``."""

    def __init__(self, links: EngineLinks, config: ServerConfig) -> None:
        self.links = links
        links.listen(self)
        self._max_waiting = config.engine.max_waiting
        self._max_running = config.engine.max_sessions
        self.info = links.welcome.info
        self.personas = links.personas
        """The engines' LoRA personas (None: a model without LoRA layers)."""
        self._streams = OutputStreams()
        self._engine_of: dict[str, EngineLink] = {}
        self._ids = itertools.count()
        self._prefix = f"{os.getpid()}"

    @classmethod
    async def connect(
        cls, endpoints: Sequence[str], index: int, config: ServerConfig, lives: Sequence[int]
    ) -> EngineProxy:
        """Connect as frontend ``index`` to every engine and wait for all their ``Welcome`` (each may still be
        loading its model). ``config``: the server's, for the engines' queue rule (``queue_full``); ``lives``: the
        supervisor's death count of each engine now (``EngineDeaths``)."""
        links = await EngineLinks.connect(endpoints, index, lives, config.engine.max_sessions)
        return cls(links, config)

    # ---- Engines ----------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.links.start()

    async def stop(self) -> None:
        """Abort this frontend's requests and fail what is still open; the engines keep serving the others."""
        for request_id in self._streams.request_ids():
            self._abort(request_id)
        self._streams.close(STOPPED)
        await self.links.stop(STOPPED)

    def engine_died(self) -> None:
        """The service ends with an engine's death (the supervisor's SIGUSR1): every stream and call fails now."""
        logger.error("an engine process died: failing %d open stream(s)", len(self._streams))
        reason = "the engine process died"
        self._streams.close(reason)
        self.links.fail(reason)

    @property
    def available(self) -> bool:
        """Whether an engine takes new utterances: one serves (not every one is dead or rejoining)."""
        return bool(self.links.serving())

    @property
    def queue_full(self) -> bool:
        """Whether every serving engine's queue was full at its latest step or heartbeat (a new request would be
        refused: it goes to the freest engine); False when none serves (the request then fails ``unavailable``)."""
        serving = [link.stats for link in self.links.serving()]
        return bool(serving) and all(engine_queue_full(s, self._max_waiting, self._max_running) for s in serving)

    def engine_stats(self) -> list[EngineStats]:
        """Each engine's load after its latest step or heartbeat, by engine index."""
        return [link.stats for link in self.links]

    @property
    def speaker(self) -> Speaker:
        return self  # each utterance on the freest engine

    def pinned(self) -> Speaker:
        """A speaker for one connection: its first utterance picks an engine, its later ones stay there (while that
        engine's process lives: after its death, the next utterance picks again)."""
        return PinnedSpeaker(self)

    def engine_speakers(self) -> list[Speaker]:
        return [PinnedSpeaker(self, engine, moves=False) for engine in self.links.engines()]

    # ---- Speaker ----------------------------------------------------------------------------------------------------

    def new_request_id(self, prefix: str = "req") -> str:
        # The pid keeps ids unique across frontends and across a frontend's restarts.
        return f"{prefix}-{self._prefix}-{next(self._ids)}"

    def _stream(self, request: Request) -> AsyncGenerator[Chunk, None]:
        return self.stream_on(self.links.freest(), request)

    async def encode_voice(self, clip: VoiceClip) -> VoicePrompt:
        """Encode a voice clip in the freest engine process (the model and its device live there)."""
        prompt = await self.links.call(self.links.freest(), lambda call_id: ipc.EncodeVoice(call_id, clip))
        assert isinstance(prompt, VoicePrompt)
        return prompt

    # ---- streams ----------------------------------------------------------------------------------------------------

    async def stream_on(self, engine: int, request: Request) -> AsyncGenerator[Chunk, None]:
        """The outputs of ``request`` on engine ``engine``; closing the iterator early aborts it there."""
        link = self.links[engine]
        request_id = request.request_id
        if link.state is not LinkState.SERVING:
            raise EngineRestartingError(f"engine {link.index} is restarting: retry shortly")
        channel = self._streams.open(request_id)
        self._engine_of[request_id] = link
        link.unconfirmed.add(request_id)
        link.send(ipc.Add(request))
        stream = self._streams.stream(request_id, channel, self._abort)
        try:
            async with contextlib.aclosing(stream):  # an early exit aborts on this engine before it is forgotten
                async for output in stream:
                    yield output
        finally:
            del self._engine_of[request_id]
            link.unconfirmed.discard(request_id)

    def _abort(self, request_id: str) -> None:
        link = self._engine_of.get(request_id)
        if link is not None and link.state is not LinkState.LOST and self._streams.closed_reason is None:
            link.send(ipc.Abort(request_id))

    # ---- what the links tell (``LinkListener``) ---------------------------------------------------------------------

    def on_outputs(self, outputs: Sequence[Chunk]) -> None:
        self._streams.dispatch(outputs)

    def on_rejected(self, request_id: str, error: BaseException) -> None:
        self._streams.reject(request_id, error)

    def on_lost(self, link: EngineLink, reason: str) -> None:
        streams = [request_id for request_id, owner in self._engine_of.items() if owner is link]
        logger.error("engine %d died: failing its %d open stream(s)", link.index, len(streams))
        for request_id in streams:
            self._streams.reject(request_id, EngineRestartingError(reason))


class PinnedSpeaker(EngineSpeaker):
    """One WebSocket connection's speaker: its utterances all run on one engine (the freest when its first one
    starts), so a voice continued from an earlier utterance is spoken where it was. If that engine's process dies,
    the next utterance picks the freest engine again (``moves``; the warm-up's speakers, one per engine, stay)."""

    def __init__(self, proxy: EngineProxy, engine: int | None = None, *, moves: bool = True) -> None:
        self._proxy = proxy
        self._engine = engine
        """None until the first utterance picks the freest engine."""
        self._life: int | None = None
        """The life of the engine picked (``EngineLinks.life``)."""
        self._moves = moves
        self.info = proxy.info
        self.personas = proxy.personas

    def new_request_id(self, prefix: str = "req") -> str:
        return self._proxy.new_request_id(prefix)

    async def encode_voice(self, clip: VoiceClip) -> VoicePrompt:
        return await self._proxy.encode_voice(clip)

    def _stream(self, request: Request) -> AsyncGenerator[Chunk, None]:
        links = self._proxy.links
        if self._engine is None or (self._moves and links.life(self._engine) != self._life):
            self._engine = links.freest()
            self._life = links.life(self._engine)
        return self._proxy.stream_on(self._engine, request)
