"""An engine process of ``voxstream serve --workers N``: owns the model and a device, runs no event loop.

With ``--devices`` there is one per device, each serving every frontend; frontends announce saved voices
to engine 0 only, so that one keeps them (and tells the other frontends).

``EngineCore.run`` is a plain loop: take every pending message from the frontends (ZeroMQ ROUTER), run
one ``Engine.step()`` when there is work, and send each frontend one ``Outputs`` message holding the
step's outputs for its requests. Voice clips are encoded on a worker thread (as the single-process
server does with ``asyncio.to_thread``), so an upload does not stall the streams. The engine also keeps
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
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType

import zmq

from voxstream.engine import Chunk, Engine, EngineError, EngineStats
from voxstream.engine.async_engine import stats_after_step
from voxstream.prompt import VoicePrompt
from voxstream.serving import ipc
from voxstream.serving.config import ServerConfig
from voxstream.serving.speech_model import SpeechModel, load_speech_model
from voxstream.serving.voices import Voice

logger = logging.getLogger(__name__)

HEARTBEAT_S = 0.25
"""How often every frontend hears the engine's load even when none of its requests runs."""
_IDLE_POLL_MS = 100
"""Longest blocking wait for a message, so a stop request or a finished voice job is seen promptly."""


class EngineCore:
    """Serves the frontends connected to ``endpoint`` until ``stop()``."""

    def __init__(self, model: SpeechModel, engine: Engine, endpoint: str) -> None:
        self.model = model
        self.engine = engine
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
        self._encoder = ThreadPoolExecutor(1, thread_name_prefix="voxstream-voice-encoder")
        self._encoded: collections.deque[tuple[bytes, int, Future[VoicePrompt]]] = collections.deque()
        self._pending_voices = 0
        self._stats = EngineStats()
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
                self._deliver_voices()
                if self.engine.next_step_at(time.monotonic()) <= time.monotonic():
                    self._step()
                self._heartbeat()
            self.engine.abort_all()
            while self.engine.has_work():
                self._step()
        finally:
            self._encoder.shutdown(wait=False, cancel_futures=True)
            self._socket.close(linger=100)
            self._context.term()

    # ---- messages ---------------------------------------------------------------------------------------------

    def _receive(self, *, wait_s: float) -> None:
        """Handle the messages that arrive within ``wait_s`` (at most the idle poll, less while voices encode)."""
        timeout = 10 if self._pending_voices else _IDLE_POLL_MS
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
            self._pending_voices += 1
            future = self._encoder.submit(self.model.make_prompt, **message.kwargs)
            future.add_done_callback(lambda done: self._encoded.append((sender, message.call_id, done)))
        elif isinstance(message, ipc.VoiceSaved):
            self._voices[message.voice.info.id] = message.voice
            self._sync_voices(sender, message.call_id, ipc.VoicesChanged((sender, message.call_id), (message.voice,)))
        elif isinstance(message, ipc.VoiceDeleted):
            self._voices.pop(message.voice_id, None)
            changes = ipc.VoicesChanged((sender, message.call_id), deleted=(message.voice_id,))
            self._sync_voices(sender, message.call_id, changes)
        elif isinstance(message, ipc.VoicesApplied):
            self._voices_applied(sender, message.sync)
        else:
            logger.error("ignoring an unknown message from %s: %r", sender.decode(), message)

    def _sync_voices(self, origin: bytes, call_id: int, changes: ipc.VoicesChanged) -> None:
        """Tell the other frontends; the origin hears ``VoicesSynced`` once all of them applied it."""
        others = self._frontends - {origin}
        self._pending_syncs[changes.sync] = others
        self._broadcast(changes, but=origin)
        if not others:
            self._voices_applied(origin, changes.sync)

    def _voices_applied(self, sender: bytes, sync: tuple[bytes, int]) -> None:
        waiting = self._pending_syncs.get(sync)
        if waiting is None:
            return
        waiting.discard(sender)
        if not waiting:
            del self._pending_syncs[sync]
            origin, call_id = sync
            self._send(origin, ipc.VoicesSynced(call_id))

    def _hello(self, sender: bytes, hello: ipc.Hello) -> None:
        # A frontend that says hello again was restarted: its previous process's requests have no listener.
        orphans = [rid for rid, owner in self._owners.items() if owner == sender]
        for rid in orphans:
            self.engine.abort(rid)
        if orphans:
            logger.warning("%s restarted (pid %d): aborted its %d request(s)", sender.decode(), hello.pid, len(orphans))
        # A restarted frontend gets every voice in its welcome: no sync waits for its old process.
        for sync in list(self._pending_syncs):
            self._voices_applied(sender, sync)
        self._frontends.add(sender)
        model = self.model
        welcome = ipc.Welcome(model.info, model.patch_shape, model.prompt_length, tuple(self._voices.values()))
        self._send(sender, welcome)

    def _add(self, sender: bytes, add: ipc.Add) -> None:
        request = add.request
        try:
            self.engine.add(request)
        except (EngineError, ValueError) as exc:
            self._send(sender, ipc.Rejected(request.request_id, exc))
            return
        self._owners[request.request_id] = sender

    def _deliver_voices(self) -> None:
        while self._encoded:
            sender, call_id, future = self._encoded.popleft()
            self._pending_voices -= 1
            error = future.exception()
            reply = ipc.VoiceEncoded(call_id, error=error) if error else ipc.VoiceEncoded(call_id, future.result())
            self._send(sender, reply)

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


def run_engine(config: ServerConfig, index: int, endpoint: str, log_level: str) -> None:
    """Engine process ``index``'s main: load the model on ``config.device``, build the engine, serve until SIGTERM."""
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s[engine-{index}]: %(message)s")
    # Ctrl-C reaches the whole process group: the supervisor decides when the engine stops (after the drain).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    model = load_speech_model(config)
    engine = Engine(model.new_runner(config), config.engine_config())
    core = EngineCore(model, engine, endpoint)

    def on_term(signum: int, frame: FrameType | None) -> None:
        core.stop()

    signal.signal(signal.SIGTERM, on_term)
    logger.info("engine process %d serving %s on %s", index, model.info.name, endpoint)
    core.run()
    logger.info("engine process stopped")
