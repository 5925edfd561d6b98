"""The speech service's two contracts, by audience, and ``SpeechService``, the one-process implementation of both.

* ``Speaker``: what speaking needs (the WebSocket sessions, the HTTP handlers): the model's info, its personas,
  request ids, ``speak(job)`` and ``encode_voice(clip)``.
* ``Engines``: what the process's lifecycle, admission and metrics need: ``start``/``stop``, the engines' load
  (``available``, ``queue_full``, ``engine_stats``), and the speakers they hand out: ``speaker`` (each utterance
  on the freest engine), ``pinned()`` (a connection's utterances on one engine), ``engine_speakers()`` (one per
  engine, for the warm-up).

``EngineSpeaker`` writes ``speak`` once for every topology (the persona check, the typed failures); each says only
how a request reaches its engine (``_stream``): ``SpeechService`` here, an engine thread in this process; under
``--workers``, a frontend's ``workers.proxy.EngineProxy`` and its ``PinnedSpeaker``, engine processes over IPC.

``SpeechService`` owns the ``SpeechModel`` (a loaded VoxCPM or the simulator), the batching ``AsyncEngine`` over its
runner, and nothing about sockets or encodings; GPU work never runs on the event loop.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Protocol

from voxwire.engine import (
    AsyncEngine,
    Chunk,
    Engine,
    EngineDeadError,
    EngineRestartingError,
    EngineStats,
    Priority,
    QueueFullError,
    Request,
    SynthesisParams,
)
from voxwire.errors import VoxwireError
from voxwire.finish_reason import FinishReason
from voxwire.prompt import VoicePrompt
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.recovery import CrashLoop, step_stall_bound_s
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.persona_names import Personas, UnknownPersonaError, check_persona
from voxwire.speech_model import ModelInfo, SpeechModel
from voxwire.voice_clip import VoiceClip

logger = logging.getLogger(__name__)

ENGINE_WATCH_S = 0.5
"""How often ``SpeechService`` looks at its engine thread (dead? stuck?)."""

__all__ = [
    "EngineSpeaker", "Engines", "ModelInfo", "Speaker", "SpeechFailure", "SpeechJob", "SpeechService",
    "UtteranceOptions", "refused", "typed_failures",
]  # fmt: skip


class SpeechFailure(VoxwireError):
    """An utterance that could not be spoken (whole): ``code`` is stable and the same on every transport;
    ``finish`` is the engine's finish reason when the engine ended it (None: refused before it started)."""

    def __init__(self, code: ErrorCode, message: str, finish: FinishReason | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.finish = finish


async def typed_failures(stream: AsyncGenerator[Chunk, None]) -> AsyncGenerator[Chunk, None]:
    """``stream``'s outputs, each failure turned into a ``SpeechFailure`` (the one place that maps them)."""
    async with contextlib.aclosing(stream):
        try:
            async for output in stream:
                if output.finish_reason is FinishReason.ERROR:
                    message = f"the engine could not synthesize this input: {output.error}"
                    raise SpeechFailure(ErrorCode.SYNTHESIS_FAILED, message, FinishReason.ERROR)
                if output.finish_reason is FinishReason.BUSY:  # it waited too long for a persona slot
                    raise SpeechFailure(ErrorCode.BUSY, f"the server is at capacity, try again later ({output.error})")
                if output.finish_reason is FinishReason.ABORTED:
                    message = "the engine stopped (the server is shutting down)"
                    raise SpeechFailure(ErrorCode.UNAVAILABLE, message, FinishReason.ABORTED)
                yield output
        except QueueFullError as exc:
            raise SpeechFailure(ErrorCode.BUSY, f"the server is at capacity, try again later ({exc})") from None
        except EngineRestartingError as exc:
            raise SpeechFailure(ErrorCode.ENGINE_RESTARTED, str(exc)) from None
        except EngineDeadError as exc:
            raise SpeechFailure(ErrorCode.UNAVAILABLE, str(exc)) from None
        except UnknownPersonaError as exc:  # the persona rule's third check: an engine process refused it
            raise SpeechFailure(ErrorCode.UNKNOWN_PERSONA, str(exc)) from None
        except ValueError as exc:  # a parameter past the engine's limits, a text it cannot use
            raise SpeechFailure(ErrorCode.SYNTHESIS_FAILED, str(exc)) from None


async def refused(failure: SpeechFailure) -> AsyncGenerator[Chunk, None]:
    """A stream that fails at its first output, as the engine's refusals do."""
    raise failure
    yield  # a generator  # pragma: no cover


@dataclass(frozen=True, slots=True)
class UtteranceOptions:
    """How one utterance is spoken, beyond its text, parameters and voice (every ``SpeechJob`` has one)."""

    persona: str | None = None
    """A LoRA persona registered now; None is the base model."""
    playback_lead_s: float | None = None
    """The real-time scheduler's deadline inputs (``Request``): the listener's lead (None: the engine's default)
    and, for a sentence continuing a stream that plays already, when its first chunk is due (on
    ``time.monotonic``, one clock for every process of the machine; None: a new stream)."""
    playback_due: float | None = None
    playback_speed: float = 1.0
    """The listener's playback rate of the model's audio (``start.speed``): its chunks are due that much sooner."""
    max_ahead_s: float | None = None
    """How far ahead of its listener the stream may run (``Request.max_ahead_s``): a WebSocket session's bound,
    ``math.inf`` for an HTTP response; None: the engine's ``--max-ahead-ms``."""
    priority: Priority = Priority.REALTIME
    """Real-time (someone listens) or batch (``Request.priority``)."""
    owner: str | None = None
    """Who asks (``personas.client_owner``: an API key's digest, else the connection): one owner's requests hold
    at most ``--persona-slots-per-client`` persona slots at once. None: no cap (the warm-up)."""


DEFAULT_OPTIONS = UtteranceOptions()


@dataclass(frozen=True, slots=True)
class SpeechJob:
    """One utterance a handler asks a ``Speaker`` to speak (``Speaker.speak``)."""

    request_id: str
    """Unique among the engines' unfinished requests (``Speaker.new_request_id``)."""
    text: str
    params: SynthesisParams
    voice: VoicePrompt | None = None
    """The voice to speak in; None: the model's default voice."""
    options: UtteranceOptions = DEFAULT_OPTIONS

    def request(self) -> Request:
        """The engine's ``Request`` for this job (the engine lays its text out: frontends never tokenize)."""
        options = self.options
        return Request(
            self.request_id, self.text, self.params, self.voice,
            playback_lead_s=options.playback_lead_s, playback_due=options.playback_due,
            playback_speed=options.playback_speed, persona=options.persona, owner=options.owner,
            max_ahead_s=options.max_ahead_s, priority=options.priority,
        )  # fmt: skip


class Speaker(Protocol):
    """What speaking needs, for the WebSocket sessions and the HTTP handlers (``EngineSpeaker`` implements it)."""

    # Read-only properties, so that an implementation may hold a narrower kind (a frontend's RemotePersonas).
    @property
    def info(self) -> ModelInfo: ...

    @property
    def personas(self) -> Personas | None:
        """The LoRA personas requests may name (None: none, e.g. the simulator)."""
        ...

    def new_request_id(self, prefix: str = "req") -> str: ...

    def speak(self, job: SpeechJob) -> AsyncGenerator[Chunk, None]:
        """Stream one utterance; closing the iterator early aborts it, and every failure raises one
        ``SpeechFailure`` (see ``EngineSpeaker.speak``)."""
        ...

    async def encode_voice(self, clip: VoiceClip) -> VoicePrompt:
        """Encode a voice clip where the model runs, off the event loop."""
        ...


class Engines(Protocol):
    """What the process's lifecycle (``app``), admission (``http.admission``) and metrics need of the engines:
    ``SpeechService`` here, ``EngineProxy`` in a frontend process (``--workers``). Speaking goes through the
    ``Speaker`` objects it hands out."""

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """End every stream still open and stop serving (the app's drain calls it, once)."""
        ...

    @property
    def available(self) -> bool:
        """Whether an engine takes new utterances now: False while every engine is dead and being replaced (new
        work is then refused with ``engine_restarted``, and ``/ready`` answers 503)."""
        ...

    @property
    def queue_full(self) -> bool:
        """Whether the engine's queue was full after its latest step (a new request would be refused)."""
        ...

    def engine_stats(self) -> list[EngineStats]:
        """Each engine's load after its latest step, by engine index (for metrics)."""
        ...

    @property
    def speaker(self) -> Speaker:
        """The speaker of work not tied to an engine (an HTTP request): each utterance on the freest engine."""
        ...

    def pinned(self) -> Speaker:
        """The speaker of one WebSocket connection: all its utterances on one engine (``--devices``), so a voice
        continued from an earlier utterance is spoken where it was."""
        ...

    def engine_speakers(self) -> list[Speaker]:
        """One speaker per engine (``--devices``), each speaking on its engine only: the warm-up runs on every one."""
        ...


async def _restarting(request: Request) -> AsyncGenerator[Chunk, None]:
    """The stream of a request made while a dead engine's replacement starts."""
    raise EngineRestartingError("the engine is restarting after a failure: retry shortly")
    yield  # a generator  # pragma: no cover


def engine_queue_full(stats: EngineStats, max_waiting: int, max_running: int) -> bool:
    """The engine's refusal rule, seen from its latest stats: ``max_waiting`` beyond the free slots."""
    return stats.waiting >= max_waiting + max_running - stats.running


class EngineSpeaker(abc.ABC):
    """A ``Speaker`` over engines: ``speak`` is written here once, for every topology, and each subclass says only
    how a request reaches its engine (``_stream``)."""

    personas: Personas | None

    def speak(self, job: SpeechJob) -> AsyncGenerator[Chunk, None]:
        """Stream one utterance; closing the iterator early aborts it (its slot is freed).

        Its persona is checked first (the persona rule's second check, ``personas.check_persona``: unknown, the
        stream fails with ``unknown_persona``), and every way it can fail (refused, engine gone, ended in error or
        by shutdown, a persona no longer loaded) raises one ``SpeechFailure`` (``typed_failures``), so each
        transport reports it with the same code."""
        try:
            check_persona(self.personas, job.options.persona)
        except UnknownPersonaError as exc:
            return refused(SpeechFailure(ErrorCode.UNKNOWN_PERSONA, str(exc)))
        return typed_failures(self._stream(job.request()))

    @abc.abstractmethod
    def _stream(self, request: Request) -> AsyncGenerator[Chunk, None]:
        """The outputs of ``request`` on an engine; its failures as the engine raises them (``speak`` types them)."""


class SpeechService(EngineSpeaker):
    """Async facade over one model and its engine, both its ``Speaker`` and its ``Engines``. Start it inside the
    event loop that will use it.

    It also keeps the engine thread serving (``recovery``): a thread that dies is replaced by a new ``Engine``
    over the same runner (the model stays loaded) while its streams end with ``engine_restarted``; a crash loop,
    or a step stuck past its bound (a thread cannot be ended), is fatal: ``on_fatal`` stops the server with exit
    status 1, so that its orchestrator restarts it rather than leave a server that takes connections and never
    answers."""

    def __init__(self, model: SpeechModel, config: ServerConfig, personas: Personas | None = None) -> None:
        self.model = model
        self.personas = personas
        """The LoRA personas requests may name; None: the base model only."""
        self.runner = model.new_runner(config.engine.runner_options())
        self._engine_config = config.engine_config()
        self.engine = self._new_engine()
        self._max_waiting = config.engine.max_waiting
        self._max_running = config.engine.max_sessions
        self.info = model.info
        self._ids = itertools.count()
        self._stall_bound_s = step_stall_bound_s(self.runner, config)
        self._crash_loop = CrashLoop(config, "engine")
        self._replacing = False
        self._watch: asyncio.Task[None] | None = None
        self.on_fatal: Callable[[str], None] = lambda reason: None
        """Called once, with the reason, when the engine can neither serve nor be replaced."""

    def _new_engine(self) -> AsyncEngine:
        return AsyncEngine(Engine(self.runner, self._engine_config), death_error=EngineRestartingError)

    async def start(self) -> None:
        self.engine.start()
        self._watch = asyncio.create_task(self._watch_engine(), name="voxwire-engine-watch")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await self.engine.stop()

    @property
    def available(self) -> bool:
        """Whether the engine takes new utterances: False while a dead engine thread's replacement starts."""
        return not self._replacing

    async def _watch_engine(self) -> None:
        """Replace the engine thread when it dies; end the server when it is stuck or crash-loops."""
        while True:
            await asyncio.sleep(ENGINE_WATCH_S)
            engine = self.engine
            since = engine.stepping_since
            if engine.death is not None:
                if not await self._replace(engine.death):
                    return
            elif since is not None and (stuck_s := time.monotonic() - since) > self._stall_bound_s:
                reason = (
                    f"the engine thread made no progress for {stuck_s:.1f} s (its bound {self._stall_bound_s:.1f} s, "
                    f"from --stall-timeout-s and --stall-factor): stuck in a step with {engine.stats().running} "
                    "running request(s); a thread cannot be ended, so the server stops (exit 1) to be restarted"
                )
                engine.abandon(reason)
                self.on_fatal(reason)
                return

    async def _replace(self, death: BaseException) -> bool:
        """Start a new engine over the same runner in place of the dead one; False if that is fatal."""
        cause = f"{type(death).__name__}: {death}"
        if self._crash_loop.died():
            self.on_fatal(f"the engine thread died ({cause}): {self._crash_loop.describe()}: the server stops (exit 1)")
            return False
        logger.error("the engine thread died (%s): its streams end with engine_restarted; starting a new one", cause)
        self._replacing = True
        try:
            self.engine = await asyncio.to_thread(self._new_engine)
            self.engine.start()
        except Exception as exc:  # nothing left to serve with
            self.on_fatal(f"the engine thread died ({cause}) and could not be replaced: {type(exc).__name__}: {exc}")
            return False
        finally:
            self._replacing = False
        logger.info("a new engine thread serves")
        return True

    @property
    def queue_full(self) -> bool:
        """Whether the engine's queue was full after its latest step (a new request would be refused): the
        engine's rule, ``max_waiting`` beyond the free slots."""
        return engine_queue_full(self.engine.stats(), self._max_waiting, self._max_running)

    @property
    def speaker(self) -> Speaker:
        return self  # one engine

    def pinned(self) -> Speaker:
        return self

    def engine_speakers(self) -> list[Speaker]:
        return [self]

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    def _stream(self, request: Request) -> AsyncGenerator[Chunk, None]:
        return self.engine.stream(request) if self.available else _restarting(request)

    def engine_stats(self) -> list[EngineStats]:
        return [self.engine.stats()]

    async def encode_voice(self, clip: VoiceClip) -> VoicePrompt:
        """Encode a voice clip off the event loop (a real model's VAE encoder runs on its device)."""
        return await asyncio.to_thread(self.model.make_prompt, clip)
