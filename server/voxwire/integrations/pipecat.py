"""A Pipecat TTS service over voxwire's WebSocket (``pip install 'voxwire[pipecat]'``).

``VoxwireTTSService`` is a ``WebsocketTTSService``: one connection for the pipeline's life, and each bot
turn (a Pipecat audio context) is one voxwire utterance, so the voice continues from sentence to sentence.

- The language model's tokens go to the server as they stream (``TextAggregationMode.TOKEN`` by default):
  the server finds the sentences and starts each one as soon as it is complete.
- At the end of the turn Pipecat flushes the context, which ends the utterance (its last words are spoken).
- On an interruption the service sends ``cancel``: the server stops within one engine step, and any audio
  of the cancelled utterance still in flight is dropped by its utterance number.
- Each sentence's ``segment`` event becomes a word timestamp for the whole sentence, so Pipecat emits the
  sentence as a ``TTSTextFrame`` when its audio starts playing.

    from voxwire.integrations.pipecat import VoxwireTTSService

    tts = VoxwireTTSService(server="ws://127.0.0.1:8000", voice="voice_0123456789abcdef")
    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(), ...])
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService

from voxwire.audio.pcm import to_s16le
from voxwire.client.errors import ClientError
from voxwire.integrations.session import Audio, SessionOptions, SpeechSession
from voxwire.protocol.wire import Done, Segment


class VoxwireTTSService(WebsocketTTSService):
    """voxwire as a Pipecat TTS; ``options`` fields (voice, seed, normalize...) may be given by name."""

    def __init__(
        self,
        *,
        server: str = "ws://127.0.0.1:8000",
        options: SessionOptions | None = None,
        sample_rate: int | None = None,
        # Pipecat's modes are an enum.StrEnum (Python 3.11, as Pipecat needs); mypy checks for 3.10, without one.
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,  # type: ignore[assignment]
        voice: str | None = None,
        seed: int | None = None,
        normalize: bool | None = None,
        **kwargs: Any,  # WebsocketTTSService's own options, passed through
    ) -> None:
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,  # sentences come back as word timestamps, in step with the audio
            push_start_frame=True,
            sample_rate=sample_rate,
            settings=TTSSettings(model="voxcpm", voice=voice, language=None),
            **kwargs,
        )
        base = options or SessionOptions()
        self._options = replace(
            base,
            server=server,
            voice=voice if voice is not None else base.voice,
            seed=seed if seed is not None else base.seed,
            normalize=normalize if normalize is not None else base.normalize,
        )
        self._session: SpeechSession | None = None
        self._contexts: dict[int, str] = {}
        """Pipecat's context id of each live utterance, by utterance number."""
        self._receive_task: asyncio.Task[None] | None = None

    def can_generate_metrics(self) -> bool:
        return True

    # FrameProcessor.setup itself narrows BaseObject.setup's argument; this override keeps FrameProcessor's.
    async def setup(self, setup: FrameProcessorSetup) -> None:  # type: ignore[override]
        await super().setup(setup)  # sets the pipeline's output rate, which the session resamples to
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._websocket and not self._receive_task:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._session is not None:
            return
        try:
            self._session = await SpeechSession.open(self._options, self.sample_rate)
        except ClientError as exc:
            await self.push_error(error_msg=f"voxwire: {exc}", exception=exc)
            await self._call_event_handler("on_connection_error", str(exc))
            return
        self._websocket = self._session.connection.ws
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        session, self._session, self._websocket = self._session, None, None
        self._contexts.clear()
        if session is not None:
            await session.close()
            await self._call_event_handler("on_disconnected")

    async def _receive_messages(self) -> None:
        assert self._session is not None
        async for event in self._session.events():
            context_id = self._contexts.get(event.utterance)
            if context_id is None or not self.audio_context_available(context_id):
                continue
            if isinstance(event, Audio):
                await self.stop_ttfb_metrics()
                audio = TTSAudioRawFrame(
                    audio=to_s16le(event.samples), sample_rate=self.sample_rate, num_channels=1, context_id=context_id
                )
                await self.append_to_audio_context(context_id, audio)
            elif isinstance(event, Segment):
                # the whole sentence as one "word", timed from the start of the utterance's audio
                start_s = event.start_sample / self._session.model_rate
                await self.add_word_timestamps([(event.text, start_s)], context_id)
            elif isinstance(event, Done):
                del self._contexts[event.utterance]
                await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
                await self.remove_audio_context(context_id)

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send the turn's text as it streams; the audio comes back on the receive task."""
        if self._session is None:
            await self._connect()
        session = self._session
        if session is None:
            yield ErrorFrame(error="voxwire: not connected")
            return
        try:
            open_utterance = session.open_utterance
            if open_utterance is not None and self._contexts.get(open_utterance) != context_id:
                await session.end()  # a new turn while the last one was still taking text
            self._contexts[await session.text(text)] = context_id
            await self.start_tts_usage_metrics(text)
        except ClientError as exc:
            yield ErrorFrame(error=f"voxwire: {exc}")
            return
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn is over: end its utterance, so the rest of its text is spoken and ``done`` follows."""
        session = self._session
        if session is None or session.open_utterance is None:
            return
        if context_id is None or self._contexts.get(session.open_utterance) == context_id:
            await session.end()

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: the server stops speaking; late frames of the cancelled utterances are dropped."""
        await self.stop_all_metrics()
        if self._session is not None:
            for utterance in await self._session.cancel():
                self._contexts.pop(utterance, None)
        await super().on_audio_context_interrupted(context_id)
