"""``SpeechService``: what the HTTP and WebSocket handlers need from the model, in one asyncio-facing object.

It owns the loaded ``VoxCPM``, the batching ``AsyncEngine`` over a ``ModelRunner``, and nothing about
sockets or encodings. Handlers ask it to speak a text (an async stream of ``StepOutput`` chunks at the
model's sample rate) and to encode voice clips; GPU work never runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from voxstream.audio.clip import AudioSource
from voxstream.engine import (
    AsyncEngine,
    Engine,
    EngineConfig,
    EngineDeadError,
    QueueFullError,
    Request,
    StepOutput,
    SynthesisParams,
)
from voxstream.engine import FinishReason as EngineFinish
from voxstream.engine.runner import ModelRunner
from voxstream.engine.voice_cache import DEFAULT_VOICE_CACHE_BYTES
from voxstream.errors import VoxstreamError
from voxstream.prompt import VoicePrompt
from voxstream.serving.protocol import ErrorCode
from voxstream.tts import VoxCPM


class SpeechFailure(VoxstreamError):
    """An utterance that could not be spoken (whole): ``code`` is stable and the same on every transport;
    ``finish`` is the engine's finish reason when the engine ended it (None: refused before it started)."""

    def __init__(self, code: ErrorCode, message: str, finish: EngineFinish | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.finish = finish


async def _typed_failures(stream: AsyncGenerator[StepOutput, None]) -> AsyncGenerator[StepOutput, None]:
    """``stream``'s outputs, each failure turned into a ``SpeechFailure`` (the one place that maps them)."""
    async with contextlib.aclosing(stream):
        try:
            async for output in stream:
                if output.finish_reason is EngineFinish.ERROR:
                    message = f"the engine could not synthesize this input: {output.error}"
                    raise SpeechFailure(ErrorCode.SYNTHESIS_FAILED, message, EngineFinish.ERROR)
                if output.finish_reason is EngineFinish.ABORTED:
                    message = "the engine stopped (the server is shutting down)"
                    raise SpeechFailure(ErrorCode.UNAVAILABLE, message, EngineFinish.ABORTED)
                yield output
        except QueueFullError as exc:
            raise SpeechFailure(ErrorCode.BUSY, f"the server is at capacity, try again later ({exc})") from None
        except EngineDeadError as exc:
            raise SpeechFailure(ErrorCode.UNAVAILABLE, str(exc)) from None
        except ValueError as exc:  # a parameter past the engine's limits, a text it cannot use
            raise SpeechFailure(ErrorCode.SYNTHESIS_FAILED, str(exc)) from None


@dataclass(frozen=True)
class ModelInfo:
    """What a client is told about the model in ``ready`` messages and headers."""

    name: str
    sample_rate: int
    samples_per_patch: int
    reference_cloning: bool
    """Whether a voice can be made from a clip without its transcript (``ModelConfig.reference_cloning``)."""

    @property
    def chunk_seconds(self) -> float:
        return self.samples_per_patch / self.sample_rate


class SpeechService:
    """Async facade over one model and its engine. Start it inside the event loop that will use it."""

    def __init__(
        self,
        tts: VoxCPM,
        engine_config: EngineConfig,
        num_slots: int,
        max_length: int | None = None,
        kv_cache_bytes: int | None = None,
        gpu_memory_utilization: float = 0.9,
        voice_cache_bytes: int = DEFAULT_VOICE_CACHE_BYTES,
    ):
        self.tts = tts
        self.runner = ModelRunner(
            tts,
            num_slots=num_slots,
            max_length=max_length,
            kv_cache_bytes=kv_cache_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            max_timesteps=engine_config.limits.max_inference_timesteps,
            voice_cache_bytes=voice_cache_bytes,
            measure_cost=engine_config.realtime,  # the real-time policy budgets steps by it
        )
        self.engine = AsyncEngine(Engine(self.runner, engine_config))
        self._max_waiting = engine_config.max_waiting
        self._max_running = engine_config.max_running
        self.info = ModelInfo(tts.name, tts.sample_rate, tts.samples_per_patch, tts.config.reference_cloning)
        self._ids = itertools.count()

    async def start(self) -> None:
        self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()

    @property
    def queue_full(self) -> bool:
        """Whether the engine's queue was full after its latest step (a new request would be refused): the
        engine's rule, ``max_waiting`` beyond the free slots."""
        stats = self.engine.stats()
        return stats.waiting >= self._max_waiting + self._max_running - stats.running

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    def prefill_tokens(self, text: str, voice: VoicePrompt | None) -> int:
        """The admission budget's estimate of a request's prompt length, in LM positions."""
        tokens = len(self.tts.tokenizer.encode(text)) + 1
        if voice is not None:
            tokens += len(self.tts.tokenizer.encode(voice.text))
            for patches in (voice.audio_patches, voice.reference_patches):
                tokens += 0 if patches is None else patches.shape[0] + 2
        return tokens

    def speak(
        self,
        request_id: str,
        text: str,
        params: SynthesisParams,
        voice: VoicePrompt | None = None,
        *,
        playback_lead_s: float | None = None,
        playback_due: float | None = None,
    ) -> AsyncGenerator[StepOutput, None]:
        """Stream one utterance; closing the iterator early aborts it (its slot is freed).

        Every way the utterance can fail (refused, engine gone, ended in error or by shutdown) raises one
        ``SpeechFailure``, so the WebSocket and HTTP paths report failures with the same codes.
        ``playback_lead_s`` and ``playback_due`` (on ``time.monotonic``) are the real-time scheduler's
        deadline inputs (``Request``); None takes the engine's default lead and starts a new stream.
        """
        tokens = self.prefill_tokens(text, voice)
        request = Request(request_id, text, tokens, params, voice, playback_lead_s, playback_due)
        return _typed_failures(self.engine.stream(request))

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def encode_voice(
        self,
        *,
        text: str | None = None,
        audio: AudioSource | None = None,
        reference_audio: AudioSource | None = None,
        sample_rate: int | None = None,
    ) -> VoicePrompt:
        """Encode a voice clip off the event loop (the VAE encoder runs on the model's device).

        ``sample_rate`` is the rate of ``audio`` and ``reference_audio`` when they are arrays."""
        return await asyncio.to_thread(
            self.tts.make_prompt,
            text=text,
            audio=audio,
            sample_rate=sample_rate,
            reference_audio=reference_audio,
            reference_sample_rate=sample_rate,
        )
