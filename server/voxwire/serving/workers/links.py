"""``EngineLinks``: a frontend's links to the engine processes, what travels on them besides request streams.

One DEALER socket and one reader task per engine process (``--devices``: one engine per device), each engine's
latest load (from the stats of its latest step or heartbeat), and the two primitives built on the links: ``call``
(a utility call to one engine, answered by its value) and ``publish`` (an announcement to engine 0, the hub,
answered once every frontend has applied it). ``SharedVoiceStore`` (``shared_voices``) and ``RemotePersonas``
(``remote_personas``) are built on them; the links hand them the changes the hub relays (``on_voices``,
``RemotePersonas.apply``).

One engine's death (``lost``: the supervisor's ``EngineDeaths`` counts moved) fails that engine's calls, and a
reconnection to the engine's successor starts (``_rejoin``). The successor rejoins once it has welcomed this
frontend and, with personas, once it holds the personas a serving engine holds (``RemotePersonas.restore``);
engine 0's successor, the hub, rebuilds its saved voices from what each frontend brings to it (``Hub.joined``),
and this frontend takes the hub's voices as they are then (the union of every frontend's, less those any frontend
saw deleted).

The links know no request stream: what concerns streams (a step's outputs, a refusal, an engine's loss) goes to
their ``LinkListener``, the ``EngineProxy`` that routes requests and keeps their streams.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import zmq
import zmq.asyncio

from voxwire.chunk import Chunk
from voxwire.engine import EngineDeadError, EngineRestartingError, EngineStats
from voxwire.serving.runtime.timeouts import within
from voxwire.serving.speech.voice_store import Voice
from voxwire.serving.workers import ipc
from voxwire.serving.workers.remote_personas import RemotePersonas

logger = logging.getLogger(__name__)

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


class EngineLink:
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
    async def connect(cls, index: int, endpoint: str, frontend: int, life: int, hello: ipc.Hello) -> EngineLink:
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


class LinkListener(Protocol):
    """What the links tell about request streams (``EngineProxy``)."""

    def on_outputs(self, outputs: Sequence[Chunk]) -> None:
        """One engine step's outputs for this frontend's requests."""
        ...

    def on_rejected(self, request_id: str, error: BaseException) -> None:
        """An engine refused a request (queue full, a bad parameter, an unknown persona)."""
        ...

    def on_lost(self, link: EngineLink, reason: str) -> None:
        """Engine ``link.index``'s process died (``reason``): the requests sent on ``link`` get no more outputs."""
        ...


class EngineLinks:
    """The engine processes' links, seen from one frontend. Build them with ``await EngineLinks.connect(...)``;
    ``listen`` before ``start``."""

    def __init__(self, links: list[EngineLink], endpoints: Sequence[str], frontend: int, max_running: int) -> None:
        self._links = links
        self._endpoints = tuple(endpoints)
        self._frontend = frontend
        self._max_running = max_running
        self.welcome = links[0].welcome
        """Engine 0's ``Welcome`` when this frontend connected: the model, and the voices saved then (engine 0
        keeps them)."""
        self.personas = RemotePersonas(self, self.welcome.personas) if self.welcome.personas is not None else None
        """The engines' LoRA personas (None: a model without LoRA layers)."""
        self._listener: LinkListener | None = None
        self._closed_reason: str | None = None
        """Set once this frontend's service ended (stopped, or its engines died): why calls fail now."""
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
        cls, endpoints: Sequence[str], frontend: int, lives: Sequence[int], max_running: int
    ) -> EngineLinks:
        """Connect as frontend ``frontend`` to every engine and wait for all their ``Welcome`` (each may still be
        loading its model). ``lives``: the supervisor's death count of each engine now (``EngineDeaths``);
        ``max_running``: an engine's slots (``freest``)."""
        hello = ipc.Hello(os.getpid())
        links = await asyncio.gather(
            *(EngineLink.connect(i, endpoint, frontend, lives[i], hello) for i, endpoint in enumerate(endpoints))
        )
        return cls(list(links), endpoints, frontend, max_running)

    def listen(self, listener: LinkListener) -> None:
        """Tell ``listener`` what concerns request streams from now on."""
        self._listener = listener

    def start(self) -> None:
        for link in self._links:
            if link.state is not LinkState.LOST and link.index not in self._readers:
                self._start_reader(link)

    async def stop(self, reason: str) -> None:
        """Fail the calls still waiting (``reason``), stop reading and reconnecting, close the sockets."""
        self.fail(reason)
        tasks = [*self._readers.values(), *(task for _, task in self._rejoins.values())]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for link in self._links:
            if link.state is not LinkState.LOST:
                link.socket.close()

    def fail(self, reason: str) -> None:
        """This frontend's service ended (``reason``): every call waiting fails now, and every later one."""
        if self._closed_reason is None:
            self._closed_reason = reason
        for _, future in self._calls.values():
            if not future.done():
                future.set_exception(EngineDeadError(reason))
        self._release_syncs()

    # ---- the engines' state -------------------------------------------------------------------------------------

    def __getitem__(self, engine: int) -> EngineLink:
        return self._links[engine]

    def __iter__(self) -> Iterator[EngineLink]:
        return iter(self._links)

    def engines(self) -> range:
        return range(len(self._links))

    def serving(self) -> list[EngineLink]:
        """The links to the engines that take new utterances now."""
        return [link for link in self._links if link.state is LinkState.SERVING]

    def freest(self) -> int:
        """The index of the serving engine with the most free capacity (``EngineLink.free``); engine 0 if none
        serves now (an utterance sent there fails with ``unavailable``)."""
        serving = self.serving()
        if not serving:
            return 0
        return max(serving, key=lambda link: link.free(self._max_running)).index

    def life(self, engine: int) -> int | None:
        """Engine ``engine``'s life (``EngineLink.life``) while it takes new utterances; None otherwise."""
        link = self._links[engine]
        return link.life if link.state is LinkState.SERVING else None

    # ---- utility calls and the hub ----------------------------------------------------------------------------

    async def call(self, engine: int, message: Callable[[int], object]) -> object:
        """Send engine ``engine`` the message ``message(call id)`` and wait for its answer's value (its error
        raised here; ``EngineDeadError`` if an engine dies first)."""
        if self._closed_reason is not None:
            raise EngineDeadError(self._closed_reason)
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

    def check_hub(self) -> None:
        """Raise ``EngineRestartingError`` while engine 0, the hub, is dead: a change of voices made now could not
        reach the other frontends (call it before making one)."""
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
            await within(future, SYNC_TIMEOUT_S)
        except asyncio.TimeoutError:
            logger.warning("a change of voices or personas reached the frontends late (over %.0f s)", SYNC_TIMEOUT_S)
        finally:
            self._syncs.pop(call_id, None)

    # ---- the engines' messages ------------------------------------------------------------------------------

    def _start_reader(self, link: EngineLink) -> None:
        self._readers[link.index] = asyncio.create_task(self._read(link), name=f"voxwire-engine-proxy-{link.index}")

    async def _read(self, link: EngineLink) -> None:
        listener = self._listener
        assert listener is not None, "EngineLinks.listen before start"
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
                listener.on_outputs(outputs)
            elif isinstance(message, ipc.Heartbeat):
                link.stats = message.stats
            elif isinstance(message, ipc.Rejected):
                link.unconfirmed.discard(message.request_id)
                listener.on_rejected(message.request_id, message.error)
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

    def _release_syncs(self) -> None:
        for synced in self._syncs.values():  # the hub is gone: no other frontend can be told now
            if not synced.done():
                synced.set_result(None)

    # ---- one engine's death and its successor -------------------------------------------------------------------

    def lost(self, deaths: Sequence[int]) -> None:
        """The supervisor's count of each engine's deaths (``EngineDeaths``): an engine whose count moved past its
        link's died and is being restarted. Its streams and calls fail now (``unavailable``), new utterances go
        to the other engines, and this frontend reconnects to its successor (again, if a successor died too)."""
        if self._closed_reason is not None:
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

    def _lose(self, link: EngineLink) -> None:
        """Engine ``link.index``'s process died: fail its streams and calls (``unavailable``), close its socket."""
        reason = f"engine {link.index}'s process died (it is being restarted): retry shortly"
        link.state = LinkState.LOST
        link.stats = EngineStats()  # it runs nothing for anyone now
        link.unconfirmed.clear()
        assert self._listener is not None, "EngineLinks.listen before start"
        self._listener.on_lost(link, reason)
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
            link = await EngineLink.connect(index, self._endpoints[index], self._frontend, life, hello)
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
