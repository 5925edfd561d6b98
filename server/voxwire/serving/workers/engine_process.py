"""An engine process of ``voxwire serve --workers N``: owns the model and a device, runs no event loop.

With ``--devices`` there is one per device, each serving every frontend. ``EngineCore`` serves requests: it
takes every pending message from the frontends (ZeroMQ ROUTER), drives its ``EngineLoop`` (the engine's
serving cycle, as ``AsyncEngine``'s thread does in one process), and sends each frontend one ``Outputs``
message per step holding the step's outputs for its requests. The other messages it hands on: voice encoding
and persona calls to ``UtilityCalls`` (worker threads, so an upload does not stall the streams), and the
announcements every frontend must see alike (saved voices, persona names) to the ``Hub``, which engine 0 keeps.
SIGTERM stops it (the supervisor sends it once the frontends have drained).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Iterable
from types import FrameType

import zmq

from voxwire.engine import Chunk, Engine, EngineError
from voxwire.engine.loop import EngineLoop
from voxwire.serving.recovery import step_stall_bound_s
from voxwire.serving.runtime.heap import freeze_startup_heap
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.load import load_speech_model
from voxwire.serving.speech.persona_names import UnknownPersonaError, check_persona
from voxwire.serving.speech.persona_registry import PersonaRegistry, open_registry
from voxwire.serving.workers import ipc
from voxwire.serving.workers.hub import HUB_MESSAGES, Hub, Letter
from voxwire.serving.workers.liveness import Activity, Pulse
from voxwire.serving.workers.utility import UTILITY_CALLS, UtilityCalls
from voxwire.speech_model import SpeechModel
from voxwire.startup import Readiness, reporting

logger = logging.getLogger(__name__)

HEARTBEAT_S = 0.25
"""How often every frontend hears the engine's load even when none of its requests runs."""
_IDLE_POLL_MS = 100
"""Longest blocking wait for a message, so a stop request or a finished utility call is seen promptly."""
_BUSY_POLL_MS = 10
"""Longest blocking wait while a utility call runs on a worker thread, so its answer leaves promptly."""


class EngineCore:
    """Serves the frontends connected to ``endpoint`` until ``stop()``."""

    def __init__(
        self,
        model: SpeechModel,
        engine: Engine,
        endpoint: str,
        personas: PersonaRegistry | None = None,
        pulse: Pulse | None = None,
        *,
        max_voice_jobs: int,
        stall_bound_s: float = math.inf,
    ) -> None:
        """``personas``: the model's LoRA personas (None: a model without LoRA layers); ``pulse``: the
        supervisor's liveness slot (``liveness``), None where no supervisor watches (tests); ``max_voice_jobs``:
        voice clips encoded or waiting to be at once, from every frontend together (``UtilityCalls``);
        ``stall_bound_s``: how long one turn of the loop (a step) may take before the supervisor counts it as
        stuck (``recovery.step_stall_bound_s``)."""
        self.pulse = pulse
        self.stall_bound_s = stall_bound_s
        self.model = model
        self.engine = engine
        self.personas = personas
        self._engine_loop = EngineLoop(engine, self._deliver)
        self._hub = Hub(personas)
        self._calls = UtilityCalls(model, personas, max_voice_jobs)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        # Never drop a message for a busy frontend: its streams would silently lose audio.
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        # A frontend that reconnects (to this engine, a restarted one) takes its identity over at once.
        self._socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._socket.bind(endpoint)
        self._owners: dict[str, bytes] = {}
        """Frontend identity of every unfinished request."""
        self._frontends: set[bytes] = set()
        """The frontends that said hello."""
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
                self._progressed(Activity.WAITING)
                self._receive(wait_s=self._engine_loop.wait_s())
                self._post(self._calls.finished())
                self._progressed(Activity.STEPPING)
                self._engine_loop.run_due()
                self._heartbeat()
            self._progressed(Activity.DRAINING)
            self._engine_loop.drain()
        finally:
            self._calls.close()
            self._socket.close(linger=100)
            self._context.term()

    # ---- messages ---------------------------------------------------------------------------------------------

    def _receive(self, *, wait_s: float) -> None:
        """Handle the messages that arrive within ``wait_s`` (at most the idle poll, less while a call runs)."""
        timeout = _BUSY_POLL_MS if self._calls.busy else _IDLE_POLL_MS
        if wait_s < timeout / 1000:
            timeout = max(0, math.ceil(wait_s * 1000))
        if not self._socket.poll(timeout):
            return
        while True:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle_frames(frames)

    def _handle_frames(self, frames: list[bytes]) -> None:
        """One message from a frontend. Anything else reaching the socket (another local process of the server's
        user may connect to it) is logged and dropped: it must not end the engine, nor run code in it."""
        if len(frames) != 2:
            logger.warning("dropped a message of %d frames on the engine socket (a frontend sends 1)", len(frames) - 1)
            return
        identity, data = frames
        try:
            message = ipc.loads(data, ipc.TO_ENGINE)
        except ipc.BadFrame as exc:
            logger.warning("dropped a frame from %r on the engine socket: %s", identity[:64], exc)
            return
        try:
            self._handle(identity, message)
        except Exception:  # a well-formed message with unusable content fails that message alone
            logger.exception("dropped a %s from %r that could not be handled", type(message).__name__, identity[:64])

    def _handle(self, sender: bytes, message: object) -> None:
        if isinstance(message, ipc.Add):
            self._add(sender, message)
        elif isinstance(message, ipc.Abort):
            if self._owners.get(message.request_id) == sender:
                self.engine.abort(message.request_id)
        elif isinstance(message, ipc.Hello):
            self._hello(sender, message)
        elif isinstance(message, UTILITY_CALLS):
            self._post(self._calls.handle(sender, message))
        elif isinstance(message, HUB_MESSAGES):
            self._post(self._hub.handle(sender, message, self._frontends))
        else:
            logger.error("ignoring an unknown message from %s: %r", sender.decode(), message)

    def _hello(self, sender: bytes, hello: ipc.Hello) -> None:
        # A frontend that says hello again was restarted: its previous process's requests have no listener.
        orphans = [rid for rid, owner in self._owners.items() if owner == sender]
        for rid in orphans:
            self.engine.abort(rid)
        if orphans:
            logger.warning("%s restarted (pid %d): aborted its %d request(s)", sender.decode(), hello.pid, len(orphans))
        self._post(self._hub.joined(sender, hello.voices, hello.deleted, self._frontends))
        self._frontends.add(sender)
        model, voices = self.model, self._hub.voices()
        personas = tuple(self.personas.names()) if self.personas is not None else None
        self._send(sender, ipc.Welcome(model.info, model.patch_shape, voices, personas))

    def _add(self, sender: bytes, add: ipc.Add) -> None:
        request = add.request
        try:
            check_persona(self.personas, request.persona)  # the persona rule's third check: this registry decides
            self._engine_loop.add(request)
        except (EngineError, ValueError, UnknownPersonaError) as exc:
            self._send(sender, ipc.Rejected(request.request_id, exc))
            return
        self._owners[request.request_id] = sender

    def _post(self, letters: Iterable[Letter]) -> None:
        for identity, message in letters:
            self._send(identity, message)

    def _send(self, identity: bytes, message: object) -> None:
        self._socket.send_multipart([identity, ipc.dumps(message)])

    def _progressed(self, activity: Activity) -> None:
        """Stamp the loop's progress for the supervisor (``liveness``): what it does now, and its bound."""
        if self.pulse is not None:
            self.pulse.progressed(
                activity, self.stall_bound_s, requests=self.engine.num_running + self.engine.num_waiting
            )

    def _heartbeat(self) -> None:
        """Tell every frontend the engine's load, at most every ``HEARTBEAT_S``."""
        now = time.monotonic()
        if now - self._last_heartbeat >= HEARTBEAT_S:
            self._last_heartbeat = now
            data = ipc.dumps(ipc.Heartbeat(self._engine_loop.stats))
            for identity in self._frontends:
                self._socket.send_multipart([identity, data])

    # ---- outputs ----------------------------------------------------------------------------------------------

    def _deliver(self, outputs: list[Chunk]) -> None:
        """Send each frontend one message with its requests' outputs, in the loop's order (first chunks first)."""
        by_frontend: dict[bytes, list[Chunk]] = {}
        for output in outputs:
            rid = output.request_id
            owner = self._owners.pop(rid, None) if output.finished else self._owners.get(rid)
            if owner is not None:
                by_frontend.setdefault(owner, []).append(output)
        for identity, owned in by_frontend.items():
            meta, audio = ipc.pack_outputs(owned, self._engine_loop.stats)
            self._socket.send_multipart([identity, meta, audio.data], copy=False)


def run_engine(config: ServerConfig, index: int, endpoint: str, log_level: str, pulse: Pulse) -> None:
    """Engine process ``index``'s main: load the model on ``config.engine.device``, build the engine, serve until
    SIGTERM."""
    pulse.start_heart()  # watched for life from now on, while it loads too
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s[engine-{index}]: %(message)s")
    # Ctrl-C reaches the whole process group: the supervisor decides when the engine stops (after the drain).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with reporting(pulse.entered):  # each phase logged, never a silent stretch, and told to the supervisor
        model = load_speech_model(config)
        personas = open_registry(model, config)  # a bad --lora ends the engine, so the server exits 1 before serving
        runner = model.new_runner(config.engine.runner_options())
    pulse.entered(Readiness.WARMING_UP)  # what is left: the frontends' warm-up utterance
    engine = Engine(runner, config.engine_config())
    core = EngineCore(
        model, engine, endpoint, personas, pulse,
        max_voice_jobs=config.voices.max_voice_jobs, stall_bound_s=step_stall_bound_s(runner, config),
    )  # fmt: skip

    def on_term(signum: int, frame: FrameType | None) -> None:
        core.stop()

    signal.signal(signal.SIGTERM, on_term)
    freeze_startup_heap(f"engine process {index}")
    logger.info("engine process %d serving %s on %s", index, model.info.name, endpoint)
    core.run()
    logger.info("engine process stopped")
