"""A LiveKit Agents TTS over voxwire's WebSocket (``pip install 'voxwire[livekit]'``).

``VoxwireTTS`` is a ``livekit.agents.tts.TTS`` with streaming: ``stream()`` sends the language model's
text as it arrives (the server starts a sentence as soon as it is complete and continues the voice from one
sentence to the next), and ``synthesize()`` speaks a whole text. Each stream is one utterance on its own
connection; closing a stream early (LiveKit does so on an interruption) sends ``cancel``, which stops the
server's work within one engine step.

    from livekit.agents import AgentSession
    from voxwire.integrations.livekit import VoxwireTTS

    session = AgentSession(tts=VoxwireTTS(server="ws://127.0.0.1:8000"), ...)
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

from livekit.agents import APIConnectionError, APIConnectOptions, tts
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS

from voxwire.audio.pcm import to_s16le
from voxwire.client.errors import ClientError
from voxwire.integrations.session import Audio, SessionOptions, SpeechSession
from voxwire.protocol.wire import Done

DEFAULT_SAMPLE_RATE = 24000
"""What the TTS hands LiveKit; the server's audio is resampled to it (LiveKit's own OpenAI TTS uses 24 kHz)."""


class VoxwireTTS(tts.TTS):
    """voxwire as a LiveKit Agents TTS; ``options`` fields (voice, seed, normalize...) may be given by name."""

    def __init__(
        self,
        *,
        server: str = "ws://127.0.0.1:8000",
        sample_rate: int = DEFAULT_SAMPLE_RATE,
        options: SessionOptions | None = None,
        **settings: object,
    ) -> None:
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True), sample_rate=sample_rate, num_channels=1)
        self.options = replace(options or SessionOptions(), server=server, **settings)  # type: ignore[arg-type]

    @property
    def model(self) -> str:
        return "voxcpm"

    @property
    def provider(self) -> str:
        return "voxwire"

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        return _ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> tts.SynthesizeStream:
        return _SynthesizeStream(tts=self, conn_options=conn_options)


async def _open(voice: VoxwireTTS) -> SpeechSession:
    try:
        return await SpeechSession.open(voice.options, voice.sample_rate)
    except ClientError as exc:
        raise APIConnectionError(str(exc)) from exc


async def _play(session: SpeechSession, utterance: int, emitter: tts.AudioEmitter) -> None:
    """Push the utterance's audio to LiveKit as 16-bit PCM until its ``done``."""
    try:
        async for event in session.events():
            if isinstance(event, Audio) and event.utterance == utterance:
                emitter.push(to_s16le(event.samples))
            elif isinstance(event, Done) and event.utterance == utterance:
                if event.finish_reason == "error":
                    raise APIConnectionError(f"voxwire could not speak utterance {utterance}")
                return
    except ClientError as exc:
        raise APIConnectionError(str(exc)) from exc


async def _stop(session: SpeechSession) -> None:
    """Leave the server idle: cancel what is still speaking (an interruption), then close."""
    with contextlib.suppress(ClientError, OSError):
        if session.speaking:
            await session.cancel()
    await session.close()


class _ChunkedStream(tts.ChunkedStream):
    """``synthesize()``: the whole text as one utterance."""

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        voice: VoxwireTTS = self._tts  # type: ignore[assignment]
        session = await _open(voice)
        try:
            output_emitter.initialize(
                request_id=f"voxwire-{id(self):x}", sample_rate=voice.sample_rate, num_channels=1,
                mime_type="audio/pcm",
            )  # fmt: skip
            if not self.input_text.strip():
                return
            utterance = await session.text(self.input_text)
            await session.end()
            await _play(session, utterance, output_emitter)
            output_emitter.flush()
        finally:
            await _stop(session)


class _SynthesizeStream(tts.SynthesizeStream):
    """``stream()``: text pushed as it comes is one utterance; LiveKit's ``flush`` speaks what is buffered."""

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        voice: VoxwireTTS = self._tts  # type: ignore[assignment]
        session = await _open(voice)
        request_id = f"voxwire-{id(self):x}"
        output_emitter.initialize(
            request_id=request_id, sample_rate=voice.sample_rate, num_channels=1, mime_type="audio/pcm", stream=True
        )
        first_text: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        """The utterance number once text went out; None when the input ended without any."""

        async def send() -> None:
            try:
                async for item in self._input_ch:
                    if isinstance(item, self._FlushSentinel):
                        await session.flush()
                        continue
                    self._mark_started()
                    utterance = await session.text(item)
                    if not first_text.done():
                        first_text.set_result(utterance)
                await session.end()
            except ClientError as exc:
                if not first_text.done():
                    first_text.set_exception(APIConnectionError(str(exc)))
                raise APIConnectionError(str(exc)) from exc
            if not first_text.done():
                first_text.set_result(None)

        sending = asyncio.create_task(send())
        try:
            utterance = await first_text
            if utterance is None:
                return
            output_emitter.start_segment(segment_id=request_id)
            await _play(session, utterance, output_emitter)
            output_emitter.end_segment()
            await sending
        finally:
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)
            await _stop(session)
