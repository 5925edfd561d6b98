"""A WebSocket session used as a voice-agent framework's TTS backend: what the Pipecat and LiveKit services share.

The framework pushes text as its language model streams it; this class keeps the protocol's bookkeeping
that every such service needs:

- settings: ``SpeechSettings`` are the ``start`` fields a framework may change between turns; ``configure``
  sends a ``start`` only when they changed since the last one, so a connection reused turn after turn costs
  no round trip before its text;
- utterance numbers: the server numbers utterances 0, 1, 2... per connection in the order they open (the
  first ``text`` after an ``end`` or ``cancel`` opens the next one), so the client knows each number without
  a round trip;
- barge-in: ``cancel`` stops every utterance that is not done, and the frames of those utterances that
  were already in flight are dropped here by their number, so no stale audio reaches the framework;
- audio as 16-bit PCM bytes at the rate the framework declared (``audio_request`` says what is asked of
  the server; frames at another rate are resampled here);
- timings: each word's start and end (``word_timings``), from the server's ``words`` messages, which come in
  parts while a sentence is still produced (about when its words are played), so that after a barge-in the
  framework holds the words heard up to it, not the whole sentence nor none of it.

Within one utterance the server continues the voice from sentence to sentence, which is why a framework turn
maps to one utterance here and not to one request per sentence.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, fields
from types import TracebackType
from typing import Any, TypedDict

import numpy as np

from voxwire.audio.pcm import S16_SCALE, to_s16le
from voxwire.audio.resample import StreamResampler
from voxwire.client.connection import OPEN_TIMEOUT_S, Connection, token_from_env
from voxwire.client.errors import AuthenticationError, ClientError, ServerError
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import (
    SAMPLE_RATES,
    AudioFrame,
    Cancel,
    Done,
    End,
    Error,
    Flush,
    Ready,
    Segment,
    Start,
    Text,
    Words,
)  # fmt: skip

DEFAULT_URL = "ws://127.0.0.1:8000"
WIRE_FORMAT = "pcm_s16le"

PERMANENT_CODES = frozenset(
    code.value
    for code in (
        ErrorCode.UNKNOWN_VOICE, ErrorCode.UNKNOWN_PERSONA, ErrorCode.FORBIDDEN, ErrorCode.UNAUTHORIZED,
        ErrorCode.UNSUPPORTED, ErrorCode.UNKNOWN_FIELD, ErrorCode.INVALID_FIELD, ErrorCode.OUT_OF_RANGE,
    )
)  # fmt: skip
"""Refusals that repeat until the settings or the key change: a framework reports them once and stops."""


class AudioRequest(TypedDict, total=False):
    """The ``start`` fields that choose the audio the server sends (``audio_request``)."""

    format: str
    sample_rate: int


def audio_request(output_rate: int) -> AudioRequest:
    """The ``start`` fields that choose the audio the server sends: 16-bit PCM at the pipeline's rate, resampled on
    the server when it is one the protocol offers (``SAMPLE_RATES``); otherwise at the model's rate, and
    ``_Decoder`` resamples it here."""
    if output_rate in SAMPLE_RATES:
        return {"format": WIRE_FORMAT, "sample_rate": output_rate}
    return {"format": WIRE_FORMAT}


def is_permanent(error: ClientError) -> bool:
    """Whether retrying would repeat ``error`` (a refused key, a refused setting): a framework reports it once and
    stops trying, where a lost or busy server is worth another try."""
    return isinstance(error, AuthenticationError) or (isinstance(error, ServerError) and error.code in PERMANENT_CODES)


@dataclass(frozen=True)
class SpeechSettings:
    """The ``start`` settings of the utterances that follow; None leaves the server's default."""

    voice: str | None = None
    persona: str | None = None
    instructions: str | None = None
    """VoxCPM2's voice design (a description of the voice), on servers that take ``start.instructions``."""
    seed: int | None = None
    cfg_value: float | None = None
    inference_timesteps: int | None = None
    max_buffer_delay_ms: int | None = None
    normalize: bool | None = None

    def start(self, output_rate: int) -> Start:
        given = {name: value for name, value in asdict(self).items() if value is not None}
        unknown = given.keys() - {field.name for field in fields(Start)}
        if unknown:
            raise ServerError(
                ErrorCode.UNKNOWN_FIELD.value, f"this voxwire protocol has no start.{', start.'.join(sorted(unknown))}"
            )
        return Start(**audio_request(output_rate), **given)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> SpeechSettings:
        """The settings among ``values`` (a framework's own settings object, as a dict, whose fields of these names
        have these types); other keys are ignored."""
        names = {field.name for field in fields(cls)}
        return cls(**{name: value for name, value in values.items() if name in names})


@dataclass(frozen=True)
class Audio:
    """16-bit little-endian mono PCM of ``utterance``, at the session's output rate."""

    utterance: int
    pcm: bytes


@dataclass(frozen=True)
class Timing:
    """A word spoken from ``start_s`` to ``end_s``, in seconds from the start of its utterance's audio (after any
    ``speed``), as the server estimated them from the audio it produced."""

    text: str
    start_s: float
    end_s: float


def word_timings(words: Words) -> list[Timing]:
    """The words of one ``words`` message (a part of a sentence's words, in order)."""
    return [Timing(*timed) for timed in zip(words.words, words.starts_s, words.ends_s, strict=True)]


SessionEvent = Audio | Segment | Words | Done | Error
"""``Error``: an utterance failed (its ``done`` follows); errors that end the connection raise instead."""


class SpeechSession:
    """One open connection; ``async with await SpeechSession.open(url, api_key, settings, output_rate)``.

    ``configure`` waits for its ``ready``, which ``events`` reads: consume ``events`` in another task meanwhile.
    """

    def __init__(self, connection: Connection, settings: SpeechSettings, output_rate: int | None) -> None:
        self.connection = connection
        self.settings = settings
        """What the next utterance speaks with (the last ``start`` the server accepted)."""
        self.output_rate = output_rate or connection.ready.sample_rate
        self._next = 0
        """The number the next utterance gets."""
        self._open: int | None = None
        """The utterance that takes text now, if any."""
        self._live: set[int] = set()
        """Utterances opened and not yet done."""
        self._cancelled: set[int] = set()
        self._decoders: dict[int, _Decoder] = {}
        self._ready: asyncio.Future[Ready] | None = None
        """The reply to a ``start`` in flight."""

    @classmethod
    async def open(
        cls, url: str, api_key: str | None, settings: SpeechSettings, output_rate: int | None = None
    ) -> SpeechSession:
        """Connect and apply ``settings``. Raises a ``voxwire.client.errors.ClientError``."""
        connection = await Connection.open(url, token_from_env(api_key))
        try:
            rate = output_rate or connection.ready.sample_rate
            await connection.configure(settings.start(rate))
        except BaseException:
            await connection.close()
            raise
        return cls(connection, settings, output_rate)

    async def __aenter__(self) -> SpeechSession:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.connection.close()

    @property
    def closed(self) -> bool:
        return self.connection.ws.close_code is not None

    @property
    def open_utterance(self) -> int | None:
        """The utterance that takes text now (None: the next ``text`` opens one)."""
        return self._open

    @property
    def next_utterance(self) -> int:
        """The number the next ``text`` opens when no utterance is open."""
        return self._next

    @property
    def speaking(self) -> bool:
        """Whether an utterance has been opened and has not finished."""
        return bool(self._live)

    async def configure(self, settings: SpeechSettings) -> None:
        """Speak the next utterance with ``settings``: a ``start`` and its ``ready`` when they changed, else nothing.

        Call between utterances. A refusal (``unknown_voice``...) raises ``ServerError`` and keeps the old settings.
        """
        if settings == self.settings:
            return
        if self._open is not None:
            raise RuntimeError("settings change between utterances; end or cancel the open one first")
        self._ready = asyncio.get_running_loop().create_future()
        try:
            await self.connection.send(settings.start(self.output_rate))
            self.connection.ready = await asyncio.wait_for(asyncio.shield(self._ready), OPEN_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ServerError("no_ready", f"no ready within {OPEN_TIMEOUT_S:g} s of a start") from None
        finally:
            self._ready = None
        self.settings = settings

    async def text(self, text: str) -> int:
        """Append text to the open utterance, opening one if needed; its number."""
        if not text:
            raise ValueError("empty text opens nothing; skip it")
        if self._open is None:
            self._open = self._next
            self._live.add(self._next)
            self._next += 1
        await self.connection.send(Text(text))
        return self._open

    async def flush(self) -> None:
        """Speak what is buffered now, even an incomplete sentence (the utterance stays open)."""
        if self._open is not None:
            await self.connection.send(Flush())

    async def end(self) -> int | None:
        """Close the open utterance (its rest is spoken, then ``done``); its number, None if none was open."""
        number, self._open = self._open, None
        if number is not None:
            await self.connection.send(End())
        return number

    async def cancel(self) -> set[int]:
        """Barge-in: stop every utterance not yet done; their late frames are dropped. The numbers cancelled."""
        cancelled = set(self._live)
        self._open = None
        if cancelled:
            self._cancelled |= cancelled
            await self.connection.send(Cancel())
        return cancelled

    async def events(self) -> AsyncIterator[SessionEvent]:
        """Audio, sentence starts, word timings, failures and ``done`` in the order the server sent them; those of
        cancelled utterances dropped.

        The reply to a ``start`` goes to ``configure``. Any other ``error`` not about an utterance (a refused
        message) raises ``ServerError``, and so does a closed connection.
        """
        while True:
            received = await self.connection.receive()
            if isinstance(received, AudioFrame):
                if received.utterance not in self._cancelled:
                    pcm = self._decoder(received.utterance).decode(received)
                    if pcm:
                        yield Audio(received.utterance, pcm)
            elif isinstance(received, Ready) or (isinstance(received, Error) and received.utterance is None):
                self._answer_start(received)
            elif isinstance(received, (Segment, Words, Error)):
                if received.utterance not in self._cancelled:
                    yield received
            elif isinstance(received, Done):
                self._live.discard(received.utterance)
                rest = self._decoders.pop(received.utterance, None)
                if rest is not None and received.utterance not in self._cancelled:
                    tail = rest.flush()
                    if tail:
                        yield Audio(received.utterance, tail)
                yield received

    def _answer_start(self, reply: Ready | Error) -> None:
        pending = self._ready
        if isinstance(reply, Ready):
            if pending is not None and not pending.done():
                pending.set_result(reply)
            return
        error = ServerError(reply.code, reply.message)
        if pending is None or pending.done():
            raise error
        pending.set_exception(error)

    def _decoder(self, utterance: int) -> _Decoder:
        if utterance not in self._decoders:
            self._decoders[utterance] = _Decoder(self.connection.ready.sample_rate, self.output_rate)
        return self._decoders[utterance]


class _Decoder:
    """One utterance's ``pcm_s16le`` frames as s16le bytes at the output rate (resampled when the rates differ)."""

    def __init__(self, frame_rate: int, output_rate: int) -> None:
        self._resampler = None if frame_rate == output_rate else StreamResampler(frame_rate, output_rate)

    def decode(self, frame: AudioFrame) -> bytes:
        if frame.format != WIRE_FORMAT:
            raise ServerError("unexpected_format", f"asked for {WIRE_FORMAT} frames, got {frame.format}")
        pcm = b"".join(frame.packets)
        if self._resampler is None:
            return pcm
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / S16_SCALE
        return _s16(self._resampler.process(samples))

    def flush(self) -> bytes:
        return b"" if self._resampler is None else _s16(self._resampler.flush())


def _s16(samples: np.ndarray) -> bytes:
    return to_s16le(samples) if samples.size else b""
