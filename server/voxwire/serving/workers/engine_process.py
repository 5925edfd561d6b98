"""An engine process of ``voxwire serve --workers N``: owns the model and a device, runs no event loop.

With ``--devices`` there is one per device, each serving every frontend; frontends announce saved voices
to engine 0 only, so that one keeps them (and tells the other frontends). Each engine owns its model's
LoRA personas (``PersonaRegistry``): frontends load and remove a persona on every engine, then announce it
to engine 0, which tells every frontend the names requests may use.

``EngineCore.run`` is a plain loop: take every pending message from the frontends (ZeroMQ ROUTER), run
one ``Engine.step()`` when there is work, and send each frontend one ``Outputs`` message holding the
step's outputs for its requests. Voice clips are encoded, and personas loaded, on worker threads (as the
single-process server does with ``asyncio.to_thread``), so an upload does not stall the streams. The engine also keeps
the saved voices that frontends announce, so that every frontend, including a restarted one, can
resolve every voice. SIGTERM stops it (the supervisor sends it once the frontends have drained).
"""

from __future__ import annotations

import collections
import logging
import math
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType

import zmq

from voxwire.engine import Chunk, Engine, EngineError
from voxwire.engine.async_engine import stats_after_step, stats_before_steps
from voxwire.prompt import VoicePrompt
from voxwire.serving.config import ServerConfig
from voxwire.serving.heap import freeze_startup_heap
from voxwire.serving.models import load_speech_model
from voxwire.serving.personas import (
    PersonaInfo,
    PersonaLoadError,
    PersonaRegistry,
    UnknownPersonaError,
    check_persona,
    open_registry,
)
from voxwire.serving.voices import Voice
from voxwire.serving.workers import ipc
from voxwire.serving.workers.liveness import Pulse
from voxwire.speech_model import SpeechModel

logger = logging.getLogger(__name__)

HEARTBEAT_S = 0.25
"""How often every frontend hears the engine's load even when none of its requests runs."""
_IDLE_POLL_MS = 100
"""Longest blocking wait for a message, so a stop request or a finished voice job is seen promptly."""

_Job = tuple[bytes, "Future[object]", Callable[["Future[object]"], object]]
"""A finished worker-thread job: its frontend, its future, and the reply made from the future."""


class EngineCore:
    """Serves the frontends connected to ``endpoint`` until ``stop()``."""

    def __init__(
        self,
        model: SpeechModel,
        engine: Engine,
        endpoint: str,
        personas: PersonaRegistry | None = None,
        pulse: Pulse | None = None,
    ) -> None:
        """``pulse``: the supervisor's heartbeat slot (``liveness``); None where no supervisor watches (tests)."""
        self.pulse = pulse
        self.model = model
        self.engine = engine
        self.personas = personas
        """The model's LoRA personas (None: a model without LoRA layers)."""
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        # Never drop a message for a busy frontend: its streams would silently lose audio.
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.bind(endpoint)
        self._owners: dict[str, bytes] = {}
        """Frontend identity of every unfinished request."""
        self._frontends: set[bytes] = set()
        self._started: set[str] = set()
        """Requests that have had an output (so their next one is not their first)."""
        self._voices: dict[str, Voice] = {}
        self._pending_syncs: dict[tuple[bytes, int], set[bytes]] = {}
        """Voice changes announced to the other frontends, and those that have not applied them yet."""
        self._encoder = ThreadPoolExecutor(1, thread_name_prefix="voxwire-voice-encoder")
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="voxwire-persona-loader")
        """One thread: persona loads run one at a time (``PersonaRegistry.add``'s rule)."""
        self._finished: collections.deque[_Job] = collections.deque()
        self._pending_jobs = 0
        self._stats = stats_before_steps(engine)
        self._last_heartbeat = 0.0
        self._stopping = False

    def stop(self) -> None:
        """Ask ``run`` to return after the current iteration (safe from a signal handler)."""
        self._stopping = True

    def run(self) -> None:
        parent = os.getppid()
        try:
            while not self._stopping:
                if os.getppid() != parent:
                    logger.error("the supervisor is gone: stopping")
                    break
                # Under the real-time policy a step may be due only later (every stream far enough ahead):
                # wait for messages until then instead of spinning.
                self._receive(wait_s=self.engine.next_step_at(time.monotonic()) - time.monotonic())
                self._deliver_jobs()
                if self.engine.next_step_at(time.monotonic()) <= time.monotonic():
                    self._step()
                self._heartbeat()
            self.engine.abort_all()
            while self.engine.has_work():
                self._step()
        finally:
            self._encoder.shutdown(wait=False, cancel_futures=True)
            self._loader.shutdown(wait=False, cancel_futures=True)
            self._socket.close(linger=100)
            self._context.term()

    # ---- messages ---------------------------------------------------------------------------------------------

    def _receive(self, *, wait_s: float) -> None:
        """Handle the messages that arrive within ``wait_s`` (at most the idle poll, less while voices encode)."""
        timeout = 10 if self._pending_jobs else _IDLE_POLL_MS
        if wait_s < timeout / 1000:
            timeout = max(0, math.ceil(wait_s * 1000))
        if not self._socket.poll(timeout):
            return
        while True:
            try:
                identity, data = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(identity, ipc.loads(data))

    def _handle(self, sender: bytes, message: object) -> None:
        if isinstance(message, ipc.Add):
            self._add(sender, message)
        elif isinstance(message, ipc.Abort):
            if self._owners.get(message.request_id) == sender:
                self.engine.abort(message.request_id)
        elif isinstance(message, ipc.Hello):
            self._hello(sender, message)
        elif isinstance(message, ipc.EncodeVoice):
            self._submit(sender, self._encoder, lambda: self.model.make_prompt(**message.kwargs), _voice_reply(message))
        elif isinstance(message, ipc.VoiceSaved):
            self._voices[message.voice.info.id] = message.voice
            self._sync(sender, ipc.VoicesChanged((sender, message.call_id), (message.voice,)))
        elif isinstance(message, ipc.VoiceDeleted):
            self._voices.pop(message.voice_id, None)
            self._sync(sender, ipc.VoicesChanged((sender, message.call_id), deleted=(message.voice_id,)))
        elif isinstance(message, ipc.Applied):
            self._applied(sender, message.sync)
        elif isinstance(message, (ipc.AddPersona, ipc.RemovePersona, ipc.ListPersonas)):
            self._persona_call(sender, message)
        elif isinstance(message, ipc.PersonasPublished):
            names = tuple(self.personas.names()) if self.personas is not None else ()
            self._sync(sender, ipc.PersonasChanged((sender, message.call_id), names), origin_too=True)
        else:
            logger.error("ignoring an unknown message from %s: %r", sender.decode(), message)

    def _sync(
        self, origin: bytes, changes: ipc.VoicesChanged | ipc.PersonasChanged, *, origin_too: bool = False
    ) -> None:
        """Tell the other frontends (and the origin, ``origin_too``); the origin hears ``Synced`` once all of
        them applied it."""
        told = self._frontends if origin_too else self._frontends - {origin}
        self._pending_syncs[changes.sync] = set(told)
        self._broadcast(changes, but=None if origin_too else origin)
        if not told:
            self._applied(origin, changes.sync)

    def _applied(self, sender: bytes, sync: tuple[bytes, int]) -> None:
        waiting = self._pending_syncs.get(sync)
        if waiting is None:
            return
        waiting.discard(sender)
        if not waiting:
            del self._pending_syncs[sync]
            origin, call_id = sync
            self._send(origin, ipc.Synced(call_id))

    def _hello(self, sender: bytes, hello: ipc.Hello) -> None:
        # A frontend that says hello again was restarted: its previous process's requests have no listener.
        orphans = [rid for rid, owner in self._owners.items() if owner == sender]
        for rid in orphans:
            self.engine.abort(rid)
        if orphans:
            logger.warning("%s restarted (pid %d): aborted its %d request(s)", sender.decode(), hello.pid, len(orphans))
        # A restarted frontend gets every voice in its welcome: no sync waits for its old process.
        for sync in list(self._pending_syncs):
            self._applied(sender, sync)
        self._frontends.add(sender)
        model = self.model
        personas = tuple(self.personas.names()) if self.personas is not None else None
        voices = tuple(self._voices.values())
        self._send(sender, ipc.Welcome(model.info, model.patch_shape, model.prompt_length, voices, personas))

    def _add(self, sender: bytes, add: ipc.Add) -> None:
        request = add.request
        try:
            check_persona(self.personas, request.persona)  # the registry here is the one that counts
            self.engine.add(request)
        except (EngineError, ValueError, UnknownPersonaError) as exc:
            self._send(sender, ipc.Rejected(request.request_id, exc))
            return
        self._owners[request.request_id] = sender

    def _persona_call(self, sender: bytes, call: ipc.AddPersona | ipc.RemovePersona | ipc.ListPersonas) -> None:
        """Answer a frontend's persona call with a ``PersonaReply``; a load runs on the loader thread."""
        registry = self.personas
        if registry is None:
            error = UnknownPersonaError("this server has no personas (its model has no LoRA layers)")
            self._send(sender, ipc.PersonaReply(call.call_id, error=error))
        elif isinstance(call, ipc.AddPersona):
            self._submit(sender, self._loader, lambda: registry.add(call.name, call.path), _persona_reply(call))
        elif isinstance(call, ipc.RemovePersona):
            try:
                registry.remove(call.name)
            except UnknownPersonaError as exc:
                self._send(sender, ipc.PersonaReply(call.call_id, error=exc))
            else:
                self._send(sender, ipc.PersonaReply(call.call_id))
        else:
            self._send(sender, ipc.PersonaReply(call.call_id, tuple(registry.infos())))

    def _submit(
        self,
        sender: bytes,
        executor: ThreadPoolExecutor,
        job: Callable[[], object],
        reply: Callable[[Future[object]], object],
    ) -> None:
        """Run ``job`` on ``executor``; the loop sends ``reply(its future)`` to ``sender`` once it is done."""
        self._pending_jobs += 1
        future = executor.submit(job)
        future.add_done_callback(lambda done: self._finished.append((sender, done, reply)))

    def _deliver_jobs(self) -> None:
        while self._finished:
            sender, future, reply = self._finished.popleft()
            self._pending_jobs -= 1
            self._send(sender, reply(future))

    def _send(self, identity: bytes, message: object) -> None:
        self._socket.send_multipart([identity, ipc.dumps(message)])

    def _broadcast(self, message: object, *, but: bytes | None = None) -> None:
        data = ipc.dumps(message)
        for identity in self._frontends:
            if identity != but:
                self._socket.send_multipart([identity, data])

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat >= HEARTBEAT_S:
            self._last_heartbeat = now
            self._broadcast(ipc.Heartbeat(self._stats))
            if self.pulse is not None:
                self.pulse.beat()

    # ---- steps ------------------------------------------------------------------------------------------------

    def _step(self) -> None:
        started = time.monotonic()
        outputs = self.engine.step(started)
        ended = time.monotonic()
        self._stats = stats_after_step(self.engine, self._stats, ended - started)
        by_frontend: dict[bytes, tuple[list[Chunk], list[Chunk]]] = {}
        for output in outputs:
            rid = output.request_id
            owner = self._owners.pop(rid, None) if output.finished else self._owners.get(rid)
            if owner is None:
                continue
            first, rest = by_frontend.setdefault(owner, ([], []))
            # A stream's first chunk goes first: the frontend handles a batch in order, and the time to first
            # audio is the latency a listener notices, while running streams are a chunk ahead of their player.
            (first if rid not in self._started else rest).append(output)
            if output.finished:
                self._started.discard(rid)
            else:
                self._started.add(rid)
        for identity, (first, rest) in by_frontend.items():
            meta, audio = ipc.pack_outputs(first + rest, self._stats)
            self._socket.send_multipart([identity, meta, audio], copy=False)
        # The chunks are on their way to the frontends: the listeners' playback clocks start here.
        self.engine.mark_sent(time.monotonic())


def _voice_reply(call: ipc.EncodeVoice) -> Callable[[Future[object]], ipc.VoiceEncoded]:
    def reply(done: Future[object]) -> ipc.VoiceEncoded:
        error = done.exception()
        if error is not None:
            return ipc.VoiceEncoded(call.call_id, error=error)
        prompt = done.result()
        assert isinstance(prompt, VoicePrompt)
        return ipc.VoiceEncoded(call.call_id, prompt)

    return reply


def _persona_reply(call: ipc.AddPersona) -> Callable[[Future[object]], ipc.PersonaReply]:
    def reply(done: Future[object]) -> ipc.PersonaReply:
        error = done.exception()
        if isinstance(error, (PersonaLoadError, UnknownPersonaError)):
            return ipc.PersonaReply(call.call_id, error=error)
        if error is not None:  # a server bug: the frontend answers 500; the traceback stays in this log
            logger.error("loading persona %r failed", call.name, exc_info=error)
            return ipc.PersonaReply(call.call_id, error=RuntimeError(f"{type(error).__name__}: {error}"))
        info = done.result()
        assert isinstance(info, PersonaInfo)
        return ipc.PersonaReply(call.call_id, (info,))

    return reply


def run_engine(config: ServerConfig, index: int, endpoint: str, log_level: str, pulse: Pulse) -> None:
    """Engine process ``index``'s main: load the model on ``config.device``, build the engine, serve until SIGTERM."""
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s[engine-{index}]: %(message)s")
    # Ctrl-C reaches the whole process group: the supervisor decides when the engine stops (after the drain).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    model = load_speech_model(config)
    personas = open_registry(model, config)  # a bad --lora ends the engine, so the server exits 1 before serving
    engine = Engine(model.new_runner(config), config.engine_config())
    core = EngineCore(model, engine, endpoint, personas, pulse)

    def on_term(signum: int, frame: FrameType | None) -> None:
        core.stop()

    signal.signal(signal.SIGTERM, on_term)
    freeze_startup_heap(f"engine process {index}")
    logger.info("engine process %d serving %s on %s", index, model.info.name, endpoint)
    core.run()
    logger.info("engine process stopped")
