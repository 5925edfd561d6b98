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

One engine's death (``lost``: the supervisor's ``EngineDeaths`` counts moved) fails that engine's streams and
calls with ``unavailable`` and nothing else: new utterances go to the engines left, a connection pinned to it
moves to the freest at its next utterance, and a reconnection to the engine's successor starts (``_rejoin``).
The successor rejoins once it has welcomed this frontend and, with personas, once it holds the personas a
serving engine holds (``RemotePersonas.restore``); engine 0's successor, the hub, rebuilds its saved voices
from what each frontend brings to it (``Hub.joined``), and this frontend takes the hub's voices as they are
then (the union of every frontend's, less those any frontend saw deleted).

Two primitives serve the rest: ``call`` (a utility call to one engine, answered by its value) and ``publish``
(an announcement to engine 0, the hub, answered once every frontend has applied it). ``SharedVoiceStore``
(``shared_voices``) and ``RemotePersonas`` (``remote_personas``) are built on them; the proxy hands them the
changes the hub relays (``on_voices``, ``RemotePersonas.apply``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import os
from collections.abc import AsyncGenerator, Callable, Sequence

import zmq
import zmq.asyncio

from voxwire.engine import Chunk, EngineDeadError, EngineRestartingError, EngineStats, LatencyHistogram, Request
from voxwire.engine.streams import OutputStreams
from voxwire.prompt import VoicePrompt
from voxwire.serving.config import ServerConfig
from voxwire.serving.personas import check_persona
from voxwire.serving.service import Service, SpeechJob, engine_queue_full, speech_stream
from voxwire.serving.voices import Voice
from voxwire.serving.workers import ipc
from voxwire.serving.workers.remote_personas import RemotePersonas
from voxwire.voice_clip import VoiceClip

logger = logging.getLogger(__name__)

STOPPED = "the engine is stopped"
SYNC_TIMEOUT_S = 5.0
"""Longest wait for every frontend to apply a change of voices or personas (one that hangs is not waited for)."""


class LinkState(enum.Enum):
    """Where one engine process stands, seen from a frontend."""

    SERVING = "serving"
    """It takes new utterances."""
    JOINING = "joining"
    """A restarted engine welcomed this frontend: it answers calls (its personas are restored) but takes no new
    utterance yet."""
    LOST = "lost"
    """It died: its streams and calls failed, its socket is closed; a successor is awaited."""


class _EngineLink:
    """One engine process seen from this frontend: its socket, its latest load, this frontend's requests on it."""

    def __init__(self, index: int, socket: zmq.asyncio.Socket, welcome: ipc.Welcome, life: int) -> None:
        self.index = index
        self.socket = socket
        self.welcome = welcome
        self.life = life
        """The supervisor's count of engine ``index``'s deaths when this link was made: which process it reaches."""
        self.state = LinkState.SERVING
        self.stats = EngineStats()
        self.unconfirmed: set[str] = set()
        """Requests sent to it whose first output has not come back: not yet certain to be in ``stats``."""

    @classmethod
    async def connect(cls, index: int, endpoint: str, frontend: int, life: int, hello: ipc.Hello) -> _EngineLink:
        """Say ``hello`` to engine ``index`` and wait for its ``Welcome`` (it may still be loading its model)."""
        socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.IDENTITY, ipc.frontend_identity(frontend))
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.LINGER, 500)  # let the aborts of a stopping frontend reach the engine
        try:
            socket.connect(endpoint)
            await socket.send(ipc.dumps(hello))
            while not isinstance(message := ipc.loads((await socket.recv_multipart())[0]), ipc.Welcome):
                pass  # outputs still addressed to a previous process with this identity
        except BaseException:  # cancelled: its engine died before welcoming this frontend
            socket.close(linger=0)
            raise
        return cls(index, socket, message, life)

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

    def __init__(self, links: list[_EngineLink], config: ServerConfig, endpoints: Sequence[str], frontend: int) -> None:
        self._links = links
        self._endpoints = tuple(endpoints)
        self._frontend = frontend
        self._max_waiting = config.engine.max_waiting
        self._max_running = config.engine.max_sessions
        welcome = links[0].welcome  # engine 0 keeps the voices
        self.info = welcome.info
        self.patch_shape = welcome.patch_shape
        self.initial_voices = welcome.voices
        self.personas = RemotePersonas(self, welcome.personas) if welcome.personas is not None else None
        """The engines' LoRA personas (None: a model without LoRA layers)."""
        self._streams = OutputStreams()
        self._engine_of: dict[str, _EngineLink] = {}
        self._ids = itertools.count()
        self._prefix = f"{os.getpid()}"
        self._call_ids = itertools.count()
        self._calls: dict[int, tuple[int, asyncio.Future[object]]] = {}
        """Calls to an engine waiting for its answer (``VoiceEncoded``, ``PersonaReply``), by call id: the engine's
        index and the future."""
        self._syncs: dict[int, asyncio.Future[None]] = {}
        self._readers: dict[int, asyncio.Task[None]] = {}
        self._rejoins: dict[int, tuple[int, asyncio.Task[None]]] = {}
        """Reconnections under way, by engine index: the life they reach and their task."""
        self.on_voices: Callable[[Sequence[Voice], Sequence[str]], None] = lambda saved, deleted: None
        """Called with the voices saved and the voice ids deleted elsewhere (other frontends' changes, relayed by
        the hub; or, when the hub restarted, what it holds now that this frontend lacks or it no longer has)."""
        self.voices_held: Callable[[], tuple[tuple[Voice, ...], tuple[str, ...]]] = lambda: ((), ())
        """The voices this frontend holds and those it saw deleted: what it brings to a restarted hub."""

    @classmethod
    async def connect(
        cls, endpoints: Sequence[str], index: int, config: ServerConfig, lives: Sequence[int]
    ) -> EngineProxy:
        """Connect as frontend ``index`` to every engine and wait for all their ``Welcome`` (each may still be
        loading its model). ``config``: the server's, for the engines' queue rule (``queue_full``); ``lives``: the
        supervisor's death count of each engine now (``EngineDeaths``)."""
        hello = ipc.Hello(os.getpid())
        links = await asyncio.gather(
            *(_EngineLink.connect(i, endpoint, index, lives[i], hello) for i, endpoint in enumerate(endpoints))
        )
        return cls(list(links), config, endpoints, index)

    async def start(self) -> None:
        for link in self._links:
            if link.state is not LinkState.LOST and link.index not in self._readers:
                self._start_reader(link)

    async def stop(self) -> None:
        """Abort this frontend's requests and fail what is still open; the engines keep serving the others."""
        for request_id in self._streams.request_ids():
            self.abort(request_id)
        self._fail(STOPPED)
        tasks = [*self._readers.values(), *(task for _, task in self._rejoins.values())]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for link in self._links:
            if link.state is not LinkState.LOST:
                link.socket.close()

    def engine_died(self) -> None:
        """The service ends with an engine's death (the supervisor's SIGUSR1): every stream and call fails now."""
        logger.error("an engine process died: failing %d open stream(s)", len(self._streams))
        self._fail("the engine process died")

    def lost(self, deaths: Sequence[int]) -> None:
        """The supervisor's count of each engine's deaths (``EngineDeaths``): an engine whose count moved past its
        link's died and is being restarted. Its streams and calls fail now (``unavailable``), new utterances go
        to the other engines, and this frontend reconnects to its successor (again, if a successor died too)."""
        if self._streams.closed_reason is not None:
            return  # stopping: nothing to reconnect for
        for index, life in enumerate(deaths):
            rejoin = self._rejoins.get(index)
            link = self._links[index]
            if life == (rejoin[0] if rejoin is not None else link.life):
                continue
            if link.state is not LinkState.LOST:
                self._lose(link)
            if rejoin is not None:
                rejoin[1].cancel()
            task = asyncio.create_task(self._rejoin(index, life), name=f"voxwire-engine-rejoin-{index}")
            self._rejoins[index] = (life, task)

    def life(self, engine: int) -> int | None:
        """Engine ``engine``'s life (``_EngineLink.life``) while it takes new utterances; None otherwise."""
        link = self._links[engine]
        return link.life if link.state is LinkState.SERVING else None

    def pinned(self) -> Service:
        """A view for one connection: its first utterance picks an engine, its later ones stay there (while that
        engine's process lives: after its death, the next utterance picks again)."""
        return _PinnedService(self)

    def per_engine(self) -> list[Service]:
        return [_PinnedService(self, link.index, moves=False) for link in self._links]

    def new_request_id(self, prefix: str = "req") -> str:
        # The pid keeps ids unique across frontends and across a frontend's restarts.
        return f"{prefix}-{self._prefix}-{next(self._ids)}"

    def speak(self, job: SpeechJob) -> AsyncGenerator[Chunk, None]:
        """Stream one utterance on the freest engine; see ``speak_on``."""
        return self.speak_on(self.freest(), job)

    def speak_on(self, engine: int, job: SpeechJob) -> AsyncGenerator[Chunk, None]:
        """Stream one utterance on engine ``engine``; closing the iterator early aborts it, and every failure
        raises one ``SpeechFailure`` (as ``SpeechService.speak``)."""
        link = self._links[engine]
        return speech_stream(self, job, lambda request: self._speak(link, request))

    async def _speak(self, link: _EngineLink, request: Request) -> AsyncGenerator[Chunk, None]:
        request_id = request.request_id
        if link.state is not LinkState.SERVING:
            raise EngineRestartingError(f"engine {link.index} is restarting: retry shortly")
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
        """The index of the serving engine with the most free capacity (``_EngineLink.free``); engine 0 if none
        serves now (an utterance sent there fails with ``unavailable``)."""
        serving = [link for link in self._links if link.state is LinkState.SERVING]
        if not serving:
            return 0
        return max(serving, key=lambda link: link.free(self._max_running)).index

    def abort(self, request_id: str) -> None:
        link = self._engine_of.get(request_id)
        if link is not None and link.state is not LinkState.LOST and self._streams.closed_reason is None:
            link.send(ipc.Abort(request_id))

    def stats(self) -> EngineStats:
        """Every engine's load added up."""
        every = self.engine_stats()
        return EngineStats(
            running=sum(s.running for s in every),
            waiting=sum(s.waiting for s in every),
            step_times=sum((s.step_times for s in every), LatencyHistogram()),
            kv_blocks_used=sum(s.kv_blocks_used for s in every),
            kv_blocks_total=sum(s.kv_blocks_total for s in every),
            graph_captures=sum(s.graph_captures for s in every),
            graph_capture_seconds=sum(s.graph_capture_seconds for s in every),
            queue_waits=sum((s.queue_waits for s in every), LatencyHistogram()),
        )

    def engine_stats(self) -> list[EngineStats]:
        """Each engine's load after its latest step or heartbeat, by engine index."""
        return [link.stats for link in self._links]

    @property
    def available(self) -> bool:
        """Whether an engine takes new utterances: one serves (not every one is dead or rejoining)."""
        return any(link.state is LinkState.SERVING for link in self._links)

    @property
    def queue_full(self) -> bool:
        """Whether every serving engine's queue was full at its latest step or heartbeat (a new request would be
        refused: it goes to the freest engine); False when none serves (the request then fails ``unavailable``)."""
        serving = [link.stats for link in self._links if link.state is LinkState.SERVING]
        return bool(serving) and all(engine_queue_full(s, self._max_waiting, self._max_running) for s in serving)

    async def encode_voice(self, clip: VoiceClip) -> VoicePrompt:
        """Encode a voice clip in the freest engine process (the model and its device live there)."""
        prompt = await self.call(self.freest(), lambda call_id: ipc.EncodeVoice(call_id, clip))
        assert isinstance(prompt, VoicePrompt)
        return prompt

    async def call(self, engine: int, message: Callable[[int], object]) -> object:
        """Send engine ``engine`` the message ``message(call id)`` and wait for its answer's value (its error
        raised here; ``EngineDeadError`` if an engine dies first)."""
        if self._streams.closed_reason is not None:
            raise EngineDeadError(self._streams.closed_reason)
        link = self._links[engine]
        if link.state is LinkState.LOST:
            raise EngineRestartingError(f"engine {engine} is restarting: retry shortly")
        call_id = next(self._call_ids)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = (engine, future)
        link.send(message(call_id))
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    def engines(self) -> range:
        return range(len(self._links))

    def check_hub(self) -> None:
        """Raise ``EngineDeadError`` while engine 0, the hub, is dead: a change of voices made now could not reach
        the other frontends (call it before making one)."""
        if self._links[0].state is LinkState.LOST:
            message = "engine 0, which shares saved voices between frontends, is restarting: retry shortly"
            raise EngineRestartingError(message)

    async def publish(self, message: Callable[[int], object]) -> None:
        """Send engine 0, the hub, the announcement ``message(call id)``; returns once every frontend it concerns
        has applied it (or after ``SYNC_TIMEOUT_S``, if one does not answer), so the client's next request
        finds the change everywhere. While the hub is dead it returns at once: its successor learns the change
        from this frontend when it rejoins (``Hub.joined``)."""
        if self._links[0].state is LinkState.LOST:
            return
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
                self.on_voices(message.saved, message.deleted)
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
        _, future = self._calls.get(call_id, (None, None))
        if future is None or future.done():
            return  # the caller left
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def _fail(self, reason: str) -> None:
        self._streams.close(reason)
        for _, future in self._calls.values():
            if not future.done():
                future.set_exception(EngineDeadError(reason))
        self._release_syncs()

    def _release_syncs(self) -> None:
        for synced in self._syncs.values():  # the hub is gone: no other frontend can be told now
            if not synced.done():
                synced.set_result(None)

    # ---- one engine's death and its successor -------------------------------------------------------------------

    def _start_reader(self, link: _EngineLink) -> None:
        self._readers[link.index] = asyncio.create_task(self._read(link), name=f"voxwire-engine-proxy-{link.index}")

    def _lose(self, link: _EngineLink) -> None:
        """Engine ``link.index``'s process died: fail its streams and calls (``unavailable``), close its socket."""
        reason = f"engine {link.index}'s process died (it is being restarted): retry shortly"
        streams = [request_id for request_id, owner in self._engine_of.items() if owner is link]
        logger.error("engine %d died: failing its %d open stream(s)", link.index, len(streams))
        link.state = LinkState.LOST
        link.stats = EngineStats()  # it runs nothing for anyone now
        link.unconfirmed.clear()
        for request_id in streams:
            self._streams.reject(request_id, EngineRestartingError(reason))
        for engine, future in self._calls.values():
            if engine == link.index and not future.done():
                future.set_exception(EngineRestartingError(reason))
        if link.index == 0:
            self._release_syncs()
        reader = self._readers.pop(link.index, None)
        if reader is not None:
            reader.cancel()
        link.socket.close(linger=0)  # nothing queued for the dead process reaches its successor

    async def _rejoin(self, index: int, life: int) -> None:
        """Reconnect to engine ``index``'s successor (it may still be loading its model), restore what it lacks,
        then route utterances to it again."""
        try:
            held, deleted = self.voices_held() if index == 0 else ((), ())
            hello = ipc.Hello(os.getpid(), held, deleted)
            link = await _EngineLink.connect(index, self._endpoints[index], self._frontend, life, hello)
            link.state = LinkState.JOINING
            self._links[index] = link
            self._start_reader(link)
            if index == 0:  # the successor hub holds every frontend's voices so far, less every deleted one
                voices = link.welcome.voices
                kept = {voice.info.id for voice in voices}
                held, _ = self.voices_held()
                self.on_voices(voices, [voice.info.id for voice in held if voice.info.id not in kept])
            source = self.freest()
            if self.personas is not None and source != index and self._links[source].state is LinkState.SERVING:
                await self.personas.restore(index, source)
            link.state = LinkState.SERVING
            logger.info("engine %d rejoined: its successor serves this frontend again", index)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: without its restored state the engine stays out of the routing
            logger.exception("engine %d could not rejoin", index)
        finally:
            entry = self._rejoins.get(index)
            if entry is not None and entry[1] is asyncio.current_task():  # not a newer one, for a newer successor
                del self._rejoins[index]


class _PinnedService:
    """One WebSocket connection's view of the ``EngineProxy``: its utterances all run on one engine (the freest
    when its first one starts), so a voice continued from an earlier utterance is spoken where it was. If that
    engine's process dies, the next utterance picks the freest engine again (``moves``; the warm-up's views, one
    per engine, stay)."""

    def __init__(self, proxy: EngineProxy, engine: int | None = None, *, moves: bool = True) -> None:
        self._proxy = proxy
        self._engine = engine
        """None until the first utterance picks the freest engine."""
        self._life: int | None = None
        """The life of the engine picked (``EngineProxy.life``)."""
        self._moves = moves
        self.info = proxy.info
        self.personas = proxy.personas

    async def start(self) -> None:
        """Nothing: the proxy is started by the app."""

    async def stop(self) -> None:
        """Nothing: the proxy is stopped by the app."""

    @property
    def queue_full(self) -> bool:
        return self._proxy.queue_full

    @property
    def available(self) -> bool:
        return self._proxy.available

    def pinned(self) -> Service:
        return self

    def per_engine(self) -> list[Service]:
        return [self]

    def new_request_id(self, prefix: str = "req") -> str:
        return self._proxy.new_request_id(prefix)

    def check_persona(self, persona: str | None) -> None:
        self._proxy.check_persona(persona)

    def speak(self, job: SpeechJob) -> AsyncGenerator[Chunk, None]:
        if self._engine is None or (self._moves and self._proxy.life(self._engine) != self._life):
            self._engine = self._proxy.freest()
            self._life = self._proxy.life(self._engine)
        return self._proxy.speak_on(self._engine, job)

    def abort(self, request_id: str) -> None:
        self._proxy.abort(request_id)

    async def encode_voice(self, clip: VoiceClip) -> VoicePrompt:
        return await self._proxy.encode_voice(clip)

    def stats(self) -> EngineStats:
        return self._proxy.stats()

    def engine_stats(self) -> list[EngineStats]:
        return self._proxy.engine_stats()
