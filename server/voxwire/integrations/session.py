"""A WebSocket session used as a voice-agent framework's TTS backend: what the Pipecat and LiveKit services share.

The framework pushes text as its language model streams it; this class keeps the protocol's bookkeeping
that every such service needs:

- utterance numbers: the server numbers utterances 0, 1, 2... per connection in the order they open (the
  first ``text`` after an ``end`` or ``cancel`` opens the next one), so the client knows each number without
  a round trip;
- barge-in: ``cancel`` stops every utterance that is not done, and the frames of those utterances that
  were already in flight are dropped here by their number, so no stale audio reaches the framework;
- audio as float32 samples at the server's rate (``pcm_f32le`` frames), resampled to the rate the framework
  declared when it differs.

Within one utterance the server continues the voice from sentence to sentence, which is why a framework turn
maps to one utterance here and not to one request per sentence.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from voxwire.audio.pcm import as_mono_float32
from voxwire.audio.resample import StreamResampler
from voxwire.client.connection import Connection
from voxwire.client.errors import ServerError
from voxwire.protocol.wire import AudioFrame, Cancel, Done, End, Error, Flush, Segment, Start, Text

WIRE_FORMAT = "pcm_f32le"


@dataclass(frozen=True)
class SessionOptions:
    """How to reach the server and the ``start`` settings every utterance of the session uses."""

    server: str = "ws://127.0.0.1:8000"
    """``host:port``, ``ws[s]://host:port`` or ``http[s]://...``; the stream path is added."""
    token: str | None = None
    voice: str | None = None
    seed: int | None = None
    cfg_value: float | None = None
    inference_timesteps: int | None = None
    max_buffer_delay_ms: int | None = None
    normalize: bool | None = None

    def start(self) -> Start:
        return Start(
            voice=self.voice,
            format=WIRE_FORMAT,
            seed=self.seed,
            cfg_value=self.cfg_value,
            inference_timesteps=self.inference_timesteps,
            max_buffer_delay_ms=self.max_buffer_delay_ms,
            normalize=self.normalize,
        )


@dataclass(frozen=True)
class Audio:
    """Samples of ``utterance`` (float32 mono at the session's output rate)."""

    utterance: int
    samples: np.ndarray


SessionEvent = Audio | Segment | Done


class SpeechSession:
    """One open connection; ``async with await SpeechSession.open(options, output_rate)``."""

    def __init__(self, connection: Connection, output_rate: int | None) -> None:
        self.connection = connection
        self.model_rate = connection.ready.sample_rate
        self.output_rate = output_rate or self.model_rate
        self._next = 0
        """The number the next utterance gets."""
        self._open: int | None = None
        """The utterance that takes text now, if any."""
        self._live: set[int] = set()
        """Utterances opened and not yet done."""
        self._cancelled: set[int] = set()
        self._resamplers: dict[int, StreamResampler] = {}

    @classmethod
    async def open(cls, options: SessionOptions, output_rate: int | None = None) -> SpeechSession:
        """Connect and apply the options. Raises a ``voxwire.client.errors.ClientError``."""
        connection = await Connection.open(options.server, options.token)
        try:
            await connection.configure(options.start())
        except BaseException:
            await connection.close()
            raise
        return cls(connection, output_rate)

    async def __aenter__(self) -> SpeechSession:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.connection.close()

    @property
    def open_utterance(self) -> int | None:
        """The utterance that takes text now (None: the next ``text`` opens one)."""
        return self._open

    @property
    def speaking(self) -> bool:
        """Whether an utterance has been opened and has not finished."""
        return bool(self._live)

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
        """Audio, sentence starts and ``done`` in the order the server sent them; cancelled audio is dropped.

        A server ``error`` (a refused message, or an utterance that failed) raises ``ServerError``, except
        for an utterance already cancelled here.
        """
        while True:
            received = await self.connection.receive()
            if isinstance(received, AudioFrame):
                if received.utterance in self._cancelled:
                    continue
                samples = self._resampler(received.utterance).process(_float_samples(received))
                if samples.size:
                    yield Audio(received.utterance, samples)
            elif isinstance(received, Segment):
                if received.utterance not in self._cancelled:
                    yield received
            elif isinstance(received, Done):
                self._live.discard(received.utterance)
                rest = self._resamplers.pop(received.utterance, None)
                if rest is not None and received.utterance not in self._cancelled:
                    tail = rest.flush()
                    if tail.size:
                        yield Audio(received.utterance, tail)
                yield received
            elif isinstance(received, Error) and received.utterance not in self._cancelled:
                raise ServerError(received.code, received.message)

    def _resampler(self, utterance: int) -> StreamResampler:
        if utterance not in self._resamplers:
            self._resamplers[utterance] = StreamResampler(self.model_rate, self.output_rate)
        return self._resamplers[utterance]


def _float_samples(frame: AudioFrame) -> np.ndarray:
    return as_mono_float32(np.frombuffer(b"".join(frame.packets), dtype="<f4"))
