"""``EngineProxy``: a frontend process's ``Service``, speaking to the engine processes over ZeroMQ.

It implements the same interface as ``SpeechService`` (``speak``, ``abort``, ``encode_voice``, ``stats``),
so the handlers, sessions and encoders of a frontend are the single-process server's, unchanged. It routes
and streams: one DEALER socket and one reader task per engine process (``--devices``: one engine per device).
An ``Outputs`` message carries a whole step's outputs for this frontend's requests on that engine, fanned out
to their streams by ``OutputStreams``. Each new utterance goes to the engine with the most free capacity
(``_EngineLink.free``: rows, then KV blocks, from the stats of its latest step or heartbeat); a WebSocket
connection's later utterances stay on the engine of its first (``pinned``). A clip is encoded on the engine
with the most free capacity; the encoded prompt travels with each request to whichever engine speaks it (and
is cached on that engine's device).

Two primitives serve the rest: ``call`` (a utility call to one engine, answered by its value) and ``publish``
(an announcement to engine 0, the hub, answered once every frontend has applied it). ``SharedVoiceStore``
(``shared_voices``) and ``RemotePersonas`` (``remote_personas``) are built on them; the proxy hands them the
changes the hub relays (``on_voices``, ``RemotePersonas.apply``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import AsyncGenerator, Callable, Sequence

import zmq
import zmq.asyncio

from voxwire.audio.clip import AudioSource
from voxwire.engine import Chunk, EngineDeadError, EngineStats, Request, SynthesisParams
from voxwire.engine.streams import OutputStreams
from voxwire.prompt import VoicePrompt
from voxwire.serving.config import ServerConfig
from voxwire.serving.personas import check_persona
from voxwire.serving.service import (
    DEFAULT_OPTIONS,
    Service,
    UtteranceOptions,
    engine_queue_full,
    speech_stream,
)
from voxwire.serving.workers import ipc
from voxwire.serving.workers.remote_personas import RemotePersonas

logger = logging.getLogger(__name__)

STOPPED = "the engine is stopped"
SYNC_TIMEOUT_S = 5.0
"""Longest wait for every frontend to apply a change of voices or personas (one that hangs is not waited for)."""


class _EngineLink:
    """One engine process seen from this frontend: its socket, its latest load, this frontend's requests on it."""

    def __init__(self, index: int, socket: zmq.asyncio.Socket, welcome: ipc.Welcome) -> None:
        self.index = index
        self.socket = socket
        self.welcome = welcome
        self.stats = EngineStats()
        self.unconfirmed: set[str] = set()
        """Requests sent to it whose first output has not come back: not yet certain to be in ``stats``."""

    @classmethod
    async def connect(cls, index: int, endpoint: str, frontend: int) -> _EngineLink:
        socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.IDENTITY, ipc.frontend_identity(frontend))
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.LINGER, 500)  # let the aborts of a stopping frontend reach the engine
        socket.connect(endpoint)
        await socket.send(ipc.dumps(ipc.Hello(os.getpid())))
        while not isinstance(message := ipc.loads((await socket.recv_multipart())[0]), ipc.Welcome):
            pass  # outputs still addressed to a previous process with this identity
        return cls(index, socket, message)

    def send(self, message: object) -> None:
        # Unbounded high-water mark: the send never blocks, and its future is already done.
        self.socket.send(ipc.dumps(message), zmq.NOBLOCK)

    def free(self, max_running: int) -> tuple[int, float, int]:
        """Its free capacity, larger is freer: free rows (slots less queued and unconfirmed requests), then the
        free share of its KV blocks, then the lower index (so ties fill the engines in turn, not at random)."""
        stats = self.stats
        rows = max_running - stats.running - stats.waiting - len(self.unconfirmed)
        blocks = 1.0 - stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 1.0
        return rows, blocks, -self.index


class EngineProxy:
    """The engine processes, seen from one frontend. Build it with ``await EngineProxy.connect(...)``."""

    def __init__(self, links: list[_EngineLink], config: ServerConfig) -> None:
        self._links = links
        self._max_waiting = config.max_waiting
        self._max_running = config.max_sessions
        welcome = links[0].welcome  # engine 0 keeps the voices
        self.info = welcome.info
        self.patch_shape = welcome.patch_shape
        self.prefill_tokens = welcome.prompt_length
        self.initial_voices = welcome.voices
        self.personas = RemotePersonas(self, welcome.personas) if welcome.personas is not None else None
        """The engines' LoRA personas (None: a model without LoRA layers)."""
        self._streams = OutputStreams()
        self._engine_of: dict[str, _EngineLink] = {}
        self._ids = itertools.count()
        self._prefix = f"{os.getpid()}"
        self._call_ids = itertools.count()
        self._calls: dict[int, asyncio.Future[object]] = {}
        """Calls to an engine waiting for its answer (``VoiceEncoded``, ``PersonaReply``), by call id."""
        self._syncs: dict[int, asyncio.Future[None]] = {}
        self._readers: list[asyncio.Task[None]] = []
        self.on_voices: Callable[[ipc.VoicesChanged], None] = lambda changes: None
        """Called with the voices other frontends saved or deleted."""

    @classmethod
    async def connect(cls, endpoints: Sequence[str], index: int, config: ServerConfig) -> EngineProxy:
        """Connect as frontend ``index`` to every engine and wait for all their ``Welcome`` (each may still be
        loading its model). ``config``: the server's, for the engines' queue rule (``queue_full``)."""
        links = await asyncio.gather(*(_EngineLink.connect(i, endpoint, index) for i, endpoint in enumerate(endpoints)))
        return cls(list(links), config)

    async def start(self) -> None:
        self._readers = [
            asyncio.create_task(self._read(link), name=f"voxwire-engine-proxy-{link.index}") for link in self._links
        ]

    async def stop(self) -> None:
        """Abort this frontend's requests and fail what is still open; the engines keep serving the others."""
        for request_id in self._streams.request_ids():
            self.abort(request_id)
        self._fail(STOPPED)
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        for link in self._links:
            link.socket.close()

    def engine_died(self) -> None:
        """The supervisor saw an engine process exit: every stream and call fails now."""
        logger.error("an engine process died: failing %d open stream(s)", len(self._streams))
        self._fail("the engine process died")

    def pinned(self) -> Service:
        """A view for one connection: its first utterance picks an engine, its later ones stay there."""
        return _PinnedService(self)

    def per_engine(self) -> list[Service]:
        return [_PinnedService(self, link.index) for link in self._links]

    def new_request_id(self, prefix: str = "req") -> str:
        # The pid keeps ids unique across frontends and across a frontend's restarts.
        return f"{prefix}-{self._prefix}-{next(self._ids)}"

    def speak(
        self,
        request_id: str,
        text: str,
        params: SynthesisParams,
        voice: VoicePrompt | None = None,
        options: UtteranceOptions = DEFAULT_OPTIONS,
    ) -> AsyncGenerator[Chunk, None]:
        """Stream one utterance on the freest engine; see ``speak_on``."""
        return self.speak_on(self.freest(), request_id, text, params, voice, options)

    def speak_on(
        self,
        engine: int,
        request_id: str,
        text: str,
        params: SynthesisParams,
        voice: VoicePrompt | None = None,
        options: UtteranceOptions = DEFAULT_OPTIONS,
    ) -> AsyncGenerator[Chunk, None]:
        """Stream one utterance on engine ``engine``; closing the iterator early aborts it, and every failure
        raises one ``SpeechFailure`` (as ``SpeechService.speak``)."""
        link = self._links[engine]
        return speech_stream(self, request_id, text, params, voice, options, lambda request: self._speak(link, request))

    async def _speak(self, link: _EngineLink, request: Request) -> AsyncGenerator[Chunk, None]:
        request_id = request.request_id
        channel = self._streams.open(request_id)
        self._engine_of[request_id] = link
        link.unconfirmed.add(request_id)
        link.send(ipc.Add(request))
        stream = self._streams.stream(request_id, channel, self.abort)
        try:
            async with contextlib.aclosing(stream):  # an early exit aborts on this engine before it is forgotten
                async for output in stream:
                    yield output
        finally:
            del self._engine_of[request_id]
            link.unconfirmed.discard(request_id)

    def check_persona(self, persona: str | None) -> None:
        check_persona(self.personas, persona)

    def freest(self) -> int:
        """The index of the engine with the most free capacity (``_EngineLink.free``)."""
        return max(self._links, key=lambda link: link.free(self._max_running)).index

    def abort(self, request_id: str) -> None:
        link = self._engine_of.get(request_id)
        if link is not None and self._streams.closed_reason is None:
            link.send(ipc.Abort(request_id))

    def stats(self) -> EngineStats:
        """Every engine's load added up."""
        every = self.engine_stats()
        return EngineStats(
            running=sum(s.running for s in every),
            waiting=sum(s.waiting for s in every),
            steps=sum(s.steps for s in every),
            step_seconds=sum(s.step_seconds for s in every),
            kv_blocks_used=sum(s.kv_blocks_used for s in every),
            kv_blocks_total=sum(s.kv_blocks_total for s in every),
            graph_captures=sum(s.graph_captures for s in every),
            graph_capture_seconds=sum(s.graph_capture_seconds for s in every),
        )

    def engine_stats(self) -> list[EngineStats]:
        """Each engine's load after its latest step or heartbeat, by engine index."""
        return [link.stats for link in self._links]

    @property
    def queue_full(self) -> bool:
        """Whether every engine's queue was full at its latest step or heartbeat (a new request would be refused:
        it goes to the freest engine)."""
        return all(engine_queue_full(s, self._max_waiting, self._max_running) for s in self.engine_stats())

    async def encode_voice(
        self,
        *,
        text: str | None = None,
        audio: AudioSource | None = None,
        reference_audio: AudioSource | None = None,
        sample_rate: int | None = None,
    ) -> VoicePrompt:
        """Encode a voice clip in the freest engine process (the model and its device live there)."""
        kwargs = {
            "text": text,
            "audio": audio,
            "sample_rate": sample_rate,
            "reference_audio": reference_audio,
            "reference_sample_rate": sample_rate,
        }
        prompt = await self.call(self.freest(), lambda call_id: ipc.EncodeVoice(call_id, kwargs))
        assert isinstance(prompt, VoicePrompt)
        return prompt

    async def call(self, engine: int, message: Callable[[int], object]) -> object:
        """Send engine ``engine`` the message ``message(call id)`` and wait for its answer's value (its error
        raised here; ``EngineDeadError`` if an engine dies first)."""
        if self._streams.closed_reason is not None:
            raise EngineDeadError(self._streams.closed_reason)
        call_id = next(self._call_ids)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._links[engine].send(message(call_id))
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    def engines(self) -> range:
        return range(len(self._links))

    async def publish(self, message: Callable[[int], object]) -> None:
        """Send engine 0, the hub, the announcement ``message(call id)``; returns once every frontend it concerns
        has applied it (or after ``SYNC_TIMEOUT_S``, if one does not answer), so the client's next request
        finds the change everywhere."""
        call_id = next(self._call_ids)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._syncs[call_id] = future
        self._links[0].send(message(call_id))
        try:
            await asyncio.wait_for(future, SYNC_TIMEOUT_S)
        except asyncio.TimeoutError:
            logger.warning("a change of voices or personas reached the frontends late (over %.0f s)", SYNC_TIMEOUT_S)
        finally:
            self._syncs.pop(call_id, None)

    # ---- the engines' messages ------------------------------------------------------------------------------

    async def _read(self, link: _EngineLink) -> None:
        while True:
            frames = await link.socket.recv_multipart()
            try:
                message = ipc.loads(frames[0], ipc.TO_FRONTEND)
            except ipc.BadFrame as exc:
                logger.warning("dropped a frame from engine %d: %s", link.index, exc)
                continue
            if isinstance(message, ipc.Outputs):
                if len(frames) != 2:
                    logger.warning("dropped outputs of engine %d without their audio frame", link.index)
                    continue
                link.stats = message.stats
                outputs = ipc.unpack_outputs(message, frames[1])
                link.unconfirmed.difference_update(output.request_id for output in outputs)
                self._streams.dispatch(outputs)
            elif isinstance(message, ipc.Heartbeat):
                link.stats = message.stats
            elif isinstance(message, ipc.Rejected):
                link.unconfirmed.discard(message.request_id)
                self._streams.reject(message.request_id, message.error)
            elif isinstance(message, ipc.VoiceEncoded):
                self._resolve(message.call_id, message.prompt, message.error)
            elif isinstance(message, ipc.PersonaReply):
                self._resolve(message.call_id, message.infos, message.error)
            elif isinstance(message, ipc.VoicesChanged):
                self.on_voices(message)
                link.send(ipc.Applied(message.sync))
            elif isinstance(message, ipc.PersonasChanged):
                if self.personas is not None:
                    self.personas.apply(message.names)
                link.send(ipc.Applied(message.sync))
            elif isinstance(message, ipc.Synced):
                synced = self._syncs.get(message.call_id)
                if synced is not None and not synced.done():
                    synced.set_result(None)

    def _resolve(self, call_id: int, value: object, error: BaseException | None) -> None:
        future = self._calls.get(call_id)
        if future is None or future.done():
            return  # the caller left
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def _fail(self, reason: str) -> None:
        self._streams.close(reason)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineDeadError(reason))
        for synced in self._syncs.values():  # no other frontend is left to tell
            if not synced.done():
                synced.set_result(None)


class _PinnedService:
    """One WebSocket connection's view of the ``EngineProxy``: its utterances all run on one engine (the freest
    when its first one starts), so a voice continued from an earlier utterance is spoken where it was."""

    def __init__(self, proxy: EngineProxy, engine: int | None = None) -> None:
        self._proxy = proxy
        self._engine = engine
        """None until the first utterance picks the freest engine."""
        self.info = proxy.info
        self.personas = proxy.personas

    async def start(self) -> None:
        """Nothing: the proxy is started by the app."""

    async def stop(self) -> None:
        """Nothing: the proxy is stopped by the app."""

    @property
    def queue_full(self) -> bool:
        return self._proxy.queue_full

    def pinned(self) -> Service:
        return self

    def per_engine(self) -> list[Service]:
        return [self]

    def new_request_id(self, prefix: str = "req") -> str:
        return self._proxy.new_request_id(prefix)

    def prefill_tokens(self, text: str, voice: VoicePrompt | None) -> int:
        return self._proxy.prefill_tokens(text, voice)

    def check_persona(self, persona: str | None) -> None:
        self._proxy.check_persona(persona)

    def speak(
        self,
        request_id: str,
        text: str,
        params: SynthesisParams,
        voice: VoicePrompt | None = None,
        options: UtteranceOptions = DEFAULT_OPTIONS,
    ) -> AsyncGenerator[Chunk, None]:
        if self._engine is None:
            self._engine = self._proxy.freest()
        return self._proxy.speak_on(self._engine, request_id, text, params, voice, options)

    def abort(self, request_id: str) -> None:
        self._proxy.abort(request_id)

    async def encode_voice(
        self,
        *,
        text: str | None = None,
        audio: AudioSource | None = None,
        reference_audio: AudioSource | None = None,
        sample_rate: int | None = None,
    ) -> VoicePrompt:
        return await self._proxy.encode_voice(
            text=text, audio=audio, reference_audio=reference_audio, sample_rate=sample_rate
        )

    def stats(self) -> EngineStats:
        return self._proxy.stats()

    def engine_stats(self) -> list[EngineStats]:
        return self._proxy.engine_stats()
