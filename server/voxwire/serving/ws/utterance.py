"""One WebSocket utterance and the settings it is spoken with.

An ``Utterance`` is its lifecycle (status, text taken, sentences waiting), which ``SessionCore`` moves;
``UtteranceAudio`` is what the asyncio driver keeps while it speaks it (encoder, delivery, voice, timings).
``Settings`` are the validated values of a ``start`` message (``resolve_settings``), announced by
``ready_message``. ``continuation`` is the rule that makes consecutive segments one voice; a designed
utterance (a control: ``instructions``, a voice name's design, or a typed ``(description)``) keeps its voice
through reference audio instead (``UtteranceAudio.carry``), as the reference allows a control with a reference
clip and never with a continuation prompt. Nothing here talks to the engine or the socket.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import functools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from voxwire.audio.formats import OpusPacketStream, StreamEncoder, make_encoder
from voxwire.audio.opus import OpusSettings
from voxwire.chunk import Patch
from voxwire.engine import ParamLimits, SynthesisParams
from voxwire.finish_reason import FinishReason
from voxwire.prompt import VoicePrompt
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import (
    MAX_SEED,
    PROTOCOL_VERSION,
    Done,
    ProtocolError,
    Ready,
    Start,
)
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.alignment import SpeakingRate
from voxwire.serving.speech.persona_names import UnknownPersonaError, check_persona
from voxwire.serving.speech.service import ModelInfo, Speaker
from voxwire.serving.speech.voice_design import DesignRefused, design_allowed, utterance_control
from voxwire.serving.speech.voice_store import UnknownVoiceError, VoiceStore
from voxwire.serving.ws.outbox import Delivery
from voxwire.text.normalize import EXTRA_HINT, normalizer_available

DEFAULT_FORMAT = "opus"
DEFAULT_AUDIO_TRANSPORT = "binary"


@dataclass(frozen=True)
class Settings:
    """What a ``start`` asked for, resolved and validated; applies to utterances opened after it."""

    voice: str | None
    prompt: VoicePrompt | None
    """The voice's latents; None is the model's default voice."""
    format: str
    params: SynthesisParams
    """``params.seed`` is the utterance's base seed (segment k uses seed + k)."""
    max_buffer_delay_ms: int
    playback_lead_ms: int
    """Audio the listener buffers before it plays (announced, else the server's default): the real-time
    scheduler's deadline for each stream."""
    max_ahead_ms: int
    """How far ahead of its playback the stream may be generated (asked for, else the server's default)."""
    normalize: bool = False
    """Each sentence is normalized (numbers, dates, money as words) before it is spoken."""
    persona: str | None = None
    """The LoRA persona every segment speaks with; None is the base model."""
    control: str | None = None
    """The voice design every sentence is spoken with (``serving/speech/voice_design.py``); None: none."""
    design_prefix: bool = False
    """Whether a ``(description)`` typed at an utterance's start is taken as its control (VoxCPM2, a voice
    without a continuation prompt)."""
    speed: float = 1.0
    """Speaking speed, pitch kept (``audio/tempo.py``)."""
    sample_rate: int | None = None
    """The rate the audio is resampled to (PCM formats); None: the format's own (the model's, or 8000 for G.711)."""
    audio_transport: str = DEFAULT_AUDIO_TRANSPORT
    """How the audio reaches the client: ``binary`` frames or ``json`` (``audio`` text frames, base64)."""

    def segment_params(self, index: int) -> SynthesisParams:
        seed = self.params.seed
        return self.params if seed is None else replace(self.params, seed=(seed + index) % MAX_SEED)


@dataclass(frozen=True)
class StartDefaults:
    """What a ``start`` gets for the timing fields it leaves out, and the server's bound on one it sets."""

    max_buffer_delay_ms: int
    playback_lead_ms: int
    max_ahead_ms: int
    max_ahead_limit_ms: int
    """The most ``start.max_ahead_ms`` may ask for (``--max-ahead-limit-ms``)."""

    @classmethod
    def of(cls, config: ServerConfig) -> StartDefaults:
        engine = config.engine
        return cls(
            config.limits.max_buffer_delay_ms, engine.playback_lead_ms, engine.max_ahead_ms, engine.ahead_limit_ms
        )


def resolve_settings(
    start: Start, voices: VoiceStore, service: Speaker, limits: ParamLimits, defaults: StartDefaults
) -> Settings:
    """The settings a ``start`` asks for. Raises ``ProtocolError`` (unknown voice or persona, values past the
    limits)."""
    try:
        prompt = voices.resolve(start.voice)
    except UnknownVoiceError as exc:
        raise ProtocolError(ErrorCode.UNKNOWN_VOICE, str(exc)) from None
    try:
        check_persona(service.personas, start.persona)  # the persona rule's first check
    except UnknownPersonaError as exc:
        raise ProtocolError(ErrorCode.UNKNOWN_PERSONA, str(exc)) from None
    given: dict[str, Any] = {
        "cfg_value": start.cfg_value,
        "inference_timesteps": start.inference_timesteps,
        "seed": start.seed,
    }
    try:
        params = SynthesisParams(**{name: value for name, value in given.items() if value is not None})
        limits.check(params)
    except ValueError as exc:
        raise ProtocolError(ErrorCode.OUT_OF_RANGE, str(exc)) from None
    delay = defaults.max_buffer_delay_ms if start.max_buffer_delay_ms is None else start.max_buffer_delay_ms
    if start.normalize and not normalizer_available():
        raise ProtocolError(ErrorCode.OUT_OF_RANGE, f"start.normalize is not available on this server: {EXTRA_HINT}")
    lead = defaults.playback_lead_ms if start.playback_lead_ms is None else start.playback_lead_ms
    ahead = defaults.max_ahead_ms if start.max_ahead_ms is None else start.max_ahead_ms
    if ahead > defaults.max_ahead_limit_ms:
        limit = defaults.max_ahead_limit_ms
        raise ProtocolError(ErrorCode.OUT_OF_RANGE, f"start.max_ahead_ms={ahead} is over this server's limit, {limit}")
    fmt = start.format or DEFAULT_FORMAT
    try:
        control = utterance_control(service.info, voices.canonical(start.voice), prompt, start.instructions)
    except DesignRefused as exc:
        raise ProtocolError(ErrorCode.UNSUPPORTED, f"start.instructions: {exc}") from None
    speed = 1.0 if start.speed is None else start.speed
    transport = start.audio_transport or DEFAULT_AUDIO_TRANSPORT
    return Settings(
        start.voice, prompt, fmt, params, delay, lead, ahead, bool(start.normalize), start.persona,
        control, design_allowed(service.info, prompt), speed, start.sample_rate, transport,
    )  # fmt: skip


def new_encoder(settings: Settings, model_rate: int, opus: OpusSettings) -> StreamEncoder:
    """One utterance's encoder: each utterance is an independent stream (Opus: its own pre-skip)."""
    return make_encoder(
        settings.format,
        model_rate,
        output_rate=settings.sample_rate,
        bitrate=opus.bitrate,
        complexity=opus.complexity,
        speed=settings.speed,
    )


def ready_message(settings: Settings, info: ModelInfo, opus: OpusSettings, context_id: str | None = None) -> Ready:
    rate, pre_skip = _stream_shape(settings.format, info.sample_rate, settings.sample_rate, opus)
    params = settings.params
    return Ready(
        PROTOCOL_VERSION, info.name, settings.format, rate, info.chunk_seconds, pre_skip,
        settings.voice, params.seed, params.cfg_value, params.inference_timesteps, settings.max_buffer_delay_ms,
        settings.playback_lead_ms,
        settings.persona,
        context_id=context_id,
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def _stream_shape(fmt: str, model_rate: int, output_rate: int | None, opus: OpusSettings) -> tuple[int, int]:
    """(sample rate, Opus pre-skip or 0) of a format's stream; cached, since building an Opus encoder to ask
    costs about 0.1 ms and every ``start`` is answered with a ``ready``."""
    encoder = make_encoder(fmt, model_rate, output_rate=output_rate, bitrate=opus.bitrate, complexity=opus.complexity)
    return encoder.sample_rate, encoder.opus.pre_skip if isinstance(encoder, OpusPacketStream) else 0


class UtteranceStatus(enum.Enum):
    """Where an utterance is in its life; it only moves forward (``Utterance.move``, ``_TRANSITIONS``)."""

    OPEN = "open"
    """Taking text (at most one per context)."""
    ENDED = "ended"
    """No more text (``end``, ``cancel``, or a failure): speaking what was queued."""
    FINISHED = "finished"
    """Its ``done`` is queued; the server still counts it live until that is sent (so a drain lets it out)."""
    RELEASED = "released"
    """Its ``done`` was sent, or the session stopped: nothing holds it any more."""


_TRANSITIONS: dict[UtteranceStatus, frozenset[UtteranceStatus]] = {
    UtteranceStatus.OPEN: frozenset({UtteranceStatus.ENDED, UtteranceStatus.RELEASED}),
    UtteranceStatus.ENDED: frozenset({UtteranceStatus.FINISHED, UtteranceStatus.RELEASED}),
    UtteranceStatus.FINISHED: frozenset({UtteranceStatus.RELEASED}),
    UtteranceStatus.RELEASED: frozenset(),
}


class SpeakingStep(enum.Enum):
    """What a live utterance is doing now; unlike its status this goes back and forth (one segment after another)."""

    WAITING = "waiting"
    """Nothing on the service: waiting for a sentence, or for the utterances before it to finish."""
    SEGMENT = "segment"
    """One of its sentences is being spoken."""
    TAIL = "tail"
    """Every sentence is spoken: its encoder's last audio is being queued, then its ``done``."""


class Utterance:
    """The lifecycle of one utterance from its first text to its ``done``, as ``SessionCore`` keeps it (no I/O)."""

    def __init__(self, number: int, settings: Settings, context_id: str | None = None) -> None:
        self.number = number
        self.settings = settings
        self.context_id = context_id
        """The context it belongs to (None: the default context)."""
        self.status = UtteranceStatus.OPEN
        self.step = SpeakingStep.WAITING
        self.chars = 0
        self.queued = 0
        """Sentences accepted for speaking so far."""
        self.pending: collections.deque[str] = collections.deque()
        """Accepted sentences not handed to the service yet, in order."""
        self.control = settings.control
        """The voice design of its every sentence: ``start``'s, or a ``(description)`` typed at its start."""
        self.spoken = 0
        """Segments the service has spoken: the next one's index (a sentence normalized to nothing takes none)."""
        self.reason = FinishReason.STOP
        """How it finishes if nothing fails: ``length`` once any segment was cut at its length cap."""
        self.live = contextlib.ExitStack()
        """Holds the server's live-utterance count until ``RELEASED``."""

    def move(self, status: UtteranceStatus) -> None:
        """Go to ``status``; a move the lifecycle does not allow is a server bug. Releasing frees ``live``."""
        if status not in _TRANSITIONS[self.status]:
            raise RuntimeError(f"utterance {self.number}: no transition {self.status.value} -> {status.value}")
        self.status = status
        if status is UtteranceStatus.RELEASED:
            self.live.close()


class UtteranceAudio:
    """What the session's driver keeps of one utterance while it is spoken: its encoder, what the socket took,
    the voice its next segment continues, and its timings (``time.monotonic``)."""

    def __init__(
        self,
        number: int,
        settings: Settings,
        model_rate: int,
        opus: OpusSettings,
        opened_at: float,
        context_id: str | None = None,
    ) -> None:
        self.number = number
        self.settings = settings
        self.context_id = context_id
        self.model_rate = model_rate
        self.encoder = new_encoder(settings, model_rate, opus)
        self.delivery = Delivery(number, settings.format, context_id, settings.audio_transport)
        self.prompt = settings.prompt
        """The voice the next segment continues, or for a designed utterance its reference (``carry``)."""
        self.started = 0
        """Segments that produced audio."""
        self.samples = 0
        """Model-rate samples produced, so the next segment starts at this offset."""
        self.speaking_rate = SpeakingRate()
        """How fast its segments so far were spoken, to time the next one's words while it is produced."""
        self.started_at = opened_at
        self.first_request_at: float | None = None
        self.first_chunk_at: float | None = None

    def carry(self, spoken: str, finish: FinishReason, patches: list[Patch], designed: bool) -> None:
        """After a segment: the next one continues it, unless it was cut at its length cap (then its audio does
        not match its text) or made no audio; then the next one starts from the voice alone.

        A designed segment (``designed``) is never continued (no continuation prompt with a control): its voice
        is the session's reference clip, or, with none, the first designed segment's audio as the reference of
        every later one (one fixed clip, so the voice does not drift and prompts do not grow).

        Raises ``InvalidInputError`` when the model produced non-finite latents (never fed back)."""
        self.prompt = next_prompt(self.settings.prompt, self.prompt, spoken, finish, patches, designed=designed)

    def done(self, reason: FinishReason) -> Done:
        """The utterance's ``done``, with what the socket has taken of it so far."""
        sent = self.delivery
        return Done(
            utterance=self.number,
            finish_reason=reason.value,
            segments=self.started,
            audio_s=round(sent.sent_s, 6),
            ttfa_s=_between(self.started_at, sent.first_sent_at),
            buffer_s=_between(self.started_at, self.first_request_at),
            engine_ttfc_s=_between(self.first_request_at, self.first_chunk_at),
            context_id=self.context_id,
        )

    @property
    def playback_lead_s(self) -> float:
        return self.settings.playback_lead_ms / 1000

    @property
    def speed(self) -> float:
        return self.settings.speed

    def playback_due(self) -> float | None:
        """When the next sentence's first chunk is due (``time.monotonic``): the listener started playing one
        lead after the utterance's first chunk and has been playing every sample produced since. None
        before the first chunk: that sentence starts a new stream. (If the listener ran dry earlier, it
        resumed later than this, so this errs early: the sentence is treated as more urgent, never less.)"""
        if self.first_chunk_at is None:
            return None
        return self.first_chunk_at + self.playback_lead_s + self.samples / self.model_rate / self.speed

    @property
    def start_sample(self) -> int:
        """Where the next segment starts, at the encoder's rate (what ``ready.sample_rate`` announced), after the
        tempo change (``start.speed``; the tempo filter's window makes this exact within a few ms)."""
        return int(self.samples * self.encoder.sample_rate / (self.model_rate * self.speed))


def next_prompt(
    base: VoicePrompt | None,
    current: VoicePrompt | None,
    spoken: str,
    finish: FinishReason,
    patches: list[Patch],
    *,
    designed: bool,
) -> VoicePrompt | None:
    """The prompt of the segment after one spoken with ``current`` in the voice ``base`` (``UtteranceAudio.carry``'s
    rule, shared with the Wyoming streams). Raises ``InvalidInputError`` on non-finite latents."""
    if designed:
        return VoicePrompt(reference_patches=np.stack(patches)) if current is None and patches else current
    return continuation(base, spoken, patches) if finish is FinishReason.STOP and patches else base


def continuation(base: VoicePrompt | None, text: str, patches: list[Patch]) -> VoicePrompt:
    """The prompt for the segment after ``text``: the session's voice followed by that segment alone.

    Only the previous segment is carried, so a prompt holds at most the voice plus one segment
    (a segment is at most the segmenter's ``max_chars``): prompts never grow with the utterance.
    The space restores the separator the segmenter stripped between the two sentences.
    """
    stacked = np.stack(patches)
    spoken = text + " "
    return VoicePrompt(spoken, stacked) if base is None else base.continued(spoken, stacked)


def _between(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 6)
