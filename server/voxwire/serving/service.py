"""``SpeechService``: what the HTTP and WebSocket handlers need from the model, in one asyncio-facing object.

It owns the ``SpeechModel`` (a loaded VoxCPM or the simulator), the batching ``AsyncEngine`` over its runner,
and nothing about
sockets or encodings. Handlers ask it to speak a text (an async stream of ``Chunk`` chunks at the
model's sample rate) and to encode voice clips; GPU work never runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Protocol

from voxwire.audio.clip import AudioSource
from voxwire.engine import (
    AsyncEngine,
    Chunk,
    Engine,
    EngineDeadError,
    EngineStats,
    QueueFullError,
    Request,
    SynthesisParams,
)
from voxwire.errors import VoxwireError
from voxwire.finish_reason import FinishReason
from voxwire.prompt import VoicePrompt
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.config import ServerConfig
from voxwire.serving.personas import Personas, UnknownPersonaError, check_persona
from voxwire.speech_model import ModelInfo, SpeechModel

__all__ = [
    "ModelInfo", "Service", "SpeechFailure", "SpeechService", "UtteranceOptions", "refused", "speech_stream",
    "typed_failures",
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
                if output.finish_reason is FinishReason.ABORTED:
                    message = "the engine stopped (the server is shutting down)"
                    raise SpeechFailure(ErrorCode.UNAVAILABLE, message, FinishReason.ABORTED)
                yield output
        except QueueFullError as exc:
            raise SpeechFailure(ErrorCode.BUSY, f"the server is at capacity, try again later ({exc})") from None
        except EngineDeadError as exc:
            raise SpeechFailure(ErrorCode.UNAVAILABLE, str(exc)) from None
        except UnknownPersonaError as exc:  # removed after the check (an engine process refused it)
            raise SpeechFailure(ErrorCode.UNKNOWN_PERSONA, str(exc)) from None
        except ValueError as exc:  # a parameter past the engine's limits, a text it cannot use
            raise SpeechFailure(ErrorCode.SYNTHESIS_FAILED, str(exc)) from None


async def refused(failure: SpeechFailure) -> AsyncGenerator[Chunk, None]:
    """A stream that fails at its first output, as the engine's refusals do."""
    raise failure
    yield  # a generator  # pragma: no cover


@dataclass(frozen=True, slots=True)
class UtteranceOptions:
    """How one utterance is spoken, beyond its text, parameters and voice (every ``Service.speak`` takes one)."""

    persona: str | None = None
    """A LoRA persona registered now; None is the base model."""
    playback_lead_s: float | None = None
    """The real-time scheduler's deadline inputs (``Request``): the listener's lead (None: the engine's default)
    and, for a sentence continuing a stream that plays already, when its first chunk is due (on
    ``time.monotonic``, one clock for every process of the machine; None: a new stream)."""
    playback_due: float | None = None


DEFAULT_OPTIONS = UtteranceOptions()


class Service(Protocol):
    """What the handlers use: ``SpeechService`` here, ``EngineProxy`` in a frontend process (``--workers``)."""

    info: ModelInfo
    personas: Personas | None
    """The LoRA personas requests may name (None: none, e.g. the simulator)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def queue_full(self) -> bool:
        """Whether the engine's queue was full after its latest step (a new request would be refused)."""
        ...

    def pinned(self) -> Service:
        """The service one WebSocket connection uses: all its utterances on one engine (``--devices``)."""
        ...

    def per_engine(self) -> list[Service]:
        """One view per engine (``--devices``), each speaking on its engine only: the warm-up runs on every one."""
        ...

    def new_request_id(self, prefix: str = "req") -> str: ...

    def prefill_tokens(self, text: str, voice: VoicePrompt | None) -> int: ...

    def check_persona(self, persona: str | None) -> None:
        """Raise ``UnknownPersonaError`` unless ``persona`` is None or loaded now."""
        ...

    def speak(
        self,
        request_id: str,
        text: str,
        params: SynthesisParams,
        voice: VoicePrompt | None = None,
        options: UtteranceOptions = DEFAULT_OPTIONS,
    ) -> AsyncGenerator[Chunk, None]:
        """Stream one utterance; every failure raises one ``SpeechFailure`` (see ``speech_stream``)."""
        ...

    def abort(self, request_id: str) -> None: ...

    async def encode_voice(
        self,
        *,
        text: str | None = None,
        audio: AudioSource | None = None,
        reference_audio: AudioSource | None = None,
        sample_rate: int | None = None,
    ) -> VoicePrompt: ...

    def stats(self) -> EngineStats:
        """The engine's load after its latest step (every engine's added up, with ``--devices``)."""
        ...

    def engine_stats(self) -> list[EngineStats]:
        """Each engine's load after its latest step, by engine index (for metrics)."""
        ...


def engine_queue_full(stats: EngineStats, max_waiting: int, max_running: int) -> bool:
    """The engine's refusal rule, seen from its latest stats: ``max_waiting`` beyond the free slots."""
    return stats.waiting >= max_waiting + max_running - stats.running


def speech_stream(
    service: Service,
    request_id: str,
    text: str,
    params: SynthesisParams,
    voice: VoicePrompt | None,
    options: UtteranceOptions,
    run: Callable[[Request], AsyncGenerator[Chunk, None]],
) -> AsyncGenerator[Chunk, None]:
    """One utterance's outputs from ``run`` (an engine's stream of its ``Request``), for every ``Service.speak``.

    Its persona is checked first (unknown: the stream fails with ``unknown_persona``), and every failure
    raises one ``SpeechFailure`` (``typed_failures``), so each transport reports it with the same code."""
    try:
        service.check_persona(options.persona)
    except UnknownPersonaError as exc:
        return refused(SpeechFailure(ErrorCode.UNKNOWN_PERSONA, str(exc)))
    request = Request(
        request_id, text, service.prefill_tokens(text, voice), params, voice,
        playback_lead_s=options.playback_lead_s, playback_due=options.playback_due, persona=options.persona,
    )  # fmt: skip
    return typed_failures(run(request))


class SpeechService:
    """Async facade over one model and its engine. Start it inside the event loop that will use it."""

    def __init__(self, model: SpeechModel, config: ServerConfig, personas: Personas | None = None) -> None:
        self.model = model
        self.personas = personas
        """The LoRA personas requests may name; None: the base model only."""
        self.runner = model.new_runner(config.runner_options())
        self.engine = AsyncEngine(Engine(self.runner, config.engine_config()))
        self._max_waiting = config.max_waiting
        self._max_running = config.max_sessions
        self.info = model.info
        self._ids = itertools.count()

    async def start(self) -> None:
        self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()

    @property
    def queue_full(self) -> bool:
        """Whether the engine's queue was full after its latest step (a new request would be refused): the
        engine's rule, ``max_waiting`` beyond the free slots."""
        return engine_queue_full(self.engine.stats(), self._max_waiting, self._max_running)

    def pinned(self) -> Service:
        return self  # one engine

    def per_engine(self) -> list[Service]:
        return [self]

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    def prefill_tokens(self, text: str, voice: VoicePrompt | None) -> int:
        """The admission budget's estimate of a request's prompt length, in LM positions."""
        return self.model.prompt_length(text, voice)

    def check_persona(self, persona: str | None) -> None:
        """Raise ``UnknownPersonaError`` unless ``persona`` is None or loaded now."""
        check_persona(self.personas, persona)

    def speak(
        self,
        request_id: str,
        text: str,
        params: SynthesisParams,
        voice: VoicePrompt | None = None,
        options: UtteranceOptions = DEFAULT_OPTIONS,
    ) -> AsyncGenerator[Chunk, None]:
        """Stream one utterance; closing the iterator early aborts it (its slot is freed).

        Every way the utterance can fail (refused, engine gone, ended in error or by shutdown, a persona
        no longer loaded) raises one ``SpeechFailure`` (``speech_stream``), so the WebSocket and HTTP
        paths report failures with the same codes.
        """
        return speech_stream(self, request_id, text, params, voice, options, self.engine.stream)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def engine_stats(self) -> list[EngineStats]:
        return [self.engine.stats()]

    async def encode_voice(
        self,
        *,
        text: str | None = None,
        audio: AudioSource | None = None,
        reference_audio: AudioSource | None = None,
        sample_rate: int | None = None,
    ) -> VoicePrompt:
        """Encode a voice clip off the event loop (a real model's VAE encoder runs on its device).

        ``sample_rate`` is the rate of ``audio`` and ``reference_audio`` when they are arrays."""
        return await asyncio.to_thread(
            self.model.make_prompt,
            text=text,
            audio=audio,
            sample_rate=sample_rate,
            reference_audio=reference_audio,
            reference_sample_rate=sample_rate,
        )
