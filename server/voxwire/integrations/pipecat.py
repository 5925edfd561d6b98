"""A Pipecat TTS service over voxwire's WebSocket (``pip install 'voxwire[pipecat]'``).

``VoxwireTTSService`` is a ``WebsocketTTSService``: one connection for the pipeline's life, and each bot
turn (a Pipecat audio context) is one voxwire utterance, so the voice continues from sentence to sentence.

- The language model's tokens go to the server as they stream (``TextAggregationMode.TOKEN`` by default):
  the server finds the sentences and starts each one as soon as it is complete.
- At the end of the turn Pipecat flushes the context, which ends the utterance (its last words are spoken).
- On an interruption the service sends ``cancel``: the server stops within one engine step, and any audio
  of the cancelled utterance still in flight is dropped by its utterance number.
- Each word the server times (its ``words`` messages, which come while a sentence is still produced) becomes
  a word timestamp, so Pipecat emits it as a ``TTSTextFrame`` when its audio plays: after an interruption the
  context holds the words played up to it. The times are the server's estimates from the audio it produced.
- ``settings=VoxwireTTSService.Settings(...)`` holds the runtime-updatable fields (voice, persona,
  instructions, seed...); a ``TTSUpdateSettingsFrame`` changes them for the next utterance.
- A refusal that would repeat (unknown voice or persona, a refused API key) is reported once with a
  permanent ``ErrorCategory``: Pipecat then stops giving the service work, until a settings update.

    from voxwire.integrations.pipecat import VoxwireTTSService

    tts = VoxwireTTSService(
        url="ws://127.0.0.1:8000", api_key="...", settings=VoxwireTTSService.Settings(voice="voice_0123456789abcdef")
    )
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.utils.errors import ErrorCategory
from pipecat.utils.types import NOT_GIVEN, NotGiven

from voxwire.client.errors import AuthenticationError, ClientError, ServerError
from voxwire.integrations.session import (
    DEFAULT_URL,
    Audio,
    SpeechSession,
    SpeechSettings,
    is_permanent,
    word_timings,
)
from voxwire.protocol.wire import Done, Error, Words

MODEL = "voxcpm"

_TOKEN_MODE = TextAggregationMode("token")
"""``TextAggregationMode.TOKEN``, made from its value: Pipecat's modes are an enum.StrEnum (Python 3.11, as Pipecat
needs), and mypy, checking for 3.10 (without one), types the members as str, the mode so made as the enum."""


@dataclass
class VoxwireTTSSettings(TTSSettings):
    """``VoxwireTTSService.Settings``: Pipecat's ``voice`` plus voxwire's ``start`` fields, all runtime-updatable.

    ``voice`` is a saved voice id, ``default`` or an OpenAI voice name; ``persona`` a LoRA persona loaded on
    the server; ``instructions`` VoxCPM2's voice design, on servers that take it.
    """

    persona: str | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)
    instructions: str | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)
    seed: int | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)
    cfg_value: float | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)
    inference_timesteps: int | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)
    max_buffer_delay_ms: int | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)
    normalize: bool | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)


class VoxwireTTSService(WebsocketTTSService):
    """voxwire as a Pipecat TTS: ``url``, ``api_key`` (default ``$VOXWIRE_TOKEN``), ``settings``."""

    Settings = VoxwireTTSSettings
    _settings: VoxwireTTSSettings

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        sample_rate: int | None = None,
        settings: VoxwireTTSSettings | None = None,
        text_aggregation_mode: TextAggregationMode = _TOKEN_MODE,
        **kwargs: Any,  # WebsocketTTSService's own options, passed through
    ) -> None:
        store = VoxwireTTSSettings(
            model=MODEL, voice=None, language=None, persona=None, instructions=None, seed=None, cfg_value=None,
            inference_timesteps=None, max_buffer_delay_ms=None, normalize=None,
        )  # fmt: skip
        if settings is not None:
            store.apply_update(settings)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,  # the text comes back as word timestamps, in step with the audio
            push_start_frame=True,
            sample_rate=sample_rate,
            settings=store,
            **kwargs,
        )
        self._url = url
        self._api_key = api_key
        self._session: SpeechSession | None = None
        self._contexts: dict[int, str] = {}
        """Pipecat's context id of each live utterance, by utterance number."""
        self._receive_task: asyncio.Task[None] | None = None
        self._failed_context: str | None = None
        """The turn that failed to connect or configure (a permanent refusal also stops Pipecat from giving the
        service more turns, until a settings update)."""

    def can_generate_metrics(self) -> bool:
        return True

    def _speech_settings(self) -> SpeechSettings:
        return SpeechSettings.of(self._settings.given_fields())

    # FrameProcessor.setup itself narrows BaseObject.setup's argument; this override keeps FrameProcessor's.
    async def setup(self, setup: FrameProcessorSetup) -> None:  # type: ignore[override]  # as FrameProcessor
        await super().setup(setup)  # sets the pipeline's output rate, which the session asks for
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        self._start_receiving()

    def _start_receiving(self) -> None:
        if self._websocket and not self._receive_task:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        try:
            await self._open_session()
        except ClientError as exc:
            await self._report(exc)

    async def _open_session(self) -> None:
        """Connect, unless connected. Raises the ``ClientError`` that refused the connection (reported by the
        caller: directly at the pipeline's start, through the turn's context in ``run_tts``)."""
        if self._session is not None:
            return
        try:
            settings = self._speech_settings()
            self._session = await SpeechSession.open(self._url, self._api_key, settings, self.sample_rate)
        except ClientError as exc:
            await self._call_event_handler("on_connection_error", str(exc))
            raise
        self._websocket = self._session.connection.ws
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        session, self._session, self._websocket = self._session, None, None
        self._contexts.clear()
        if session is not None:
            await session.close()
            await self._call_event_handler("on_disconnected")

    def _error_frame(self, exc: ClientError) -> ErrorFrame:
        """The error as Pipecat takes it: a permanent category when retrying would repeat it (Pipecat then stops
        giving the service work, until a settings update)."""
        if is_permanent(exc):
            auth = isinstance(exc, AuthenticationError)
            category = ErrorCategory.AUTHENTICATION if auth else ErrorCategory.INVALID_REQUEST
        else:
            category = ErrorCategory.SERVER if isinstance(exc, ServerError) else ErrorCategory.CONNECTIVITY
        return ErrorFrame(error=f"voxwire: {exc}", exception=exc, processor=self, category=category)

    async def _report(self, exc: ClientError) -> None:
        """One error frame, now (an error of no turn)."""
        await self.push_error_frame(self._error_frame(exc))

    # TTSService itself narrows AIService's ServiceSettings to TTSSettings; this override keeps TTSService's.
    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:  # type: ignore[override]  # as TTSService
        """Store the delta; the next utterance opens with it (the one speaking keeps its voice to its end)."""
        changed = await super()._update_settings(delta)
        self._warn_unhandled_updated_settings(changed.keys() & {"model", "language"})
        return changed

    async def _receive_messages(self) -> None:
        session = self._session
        assert session is not None
        async for event in session.events():
            context_id = None if event.utterance is None else self._contexts.get(event.utterance)
            if context_id is None or not self.audio_context_available(context_id):
                continue
            if isinstance(event, Audio):
                await self.stop_ttfb_metrics()
                audio = TTSAudioRawFrame(event.pcm, self.sample_rate, num_channels=1, context_id=context_id)
                await self.append_to_audio_context(context_id, audio)
            elif isinstance(event, Words):
                await self.add_word_timestamps([(t.text, t.start_s) for t in word_timings(event)], context_id)
            elif isinstance(event, Error):  # the utterance failed; its done follows
                # In the context's place, so Pipecat reads it (a permanent one writes the service off) before the
                # context ends without audio, which it would otherwise count as a failure of its own.
                failure = self._error_frame(ServerError(event.code, event.message))
                await self.append_to_audio_context(context_id, failure)
            elif isinstance(event, Done):
                del self._contexts[event.utterance]
                await self._end_context(context_id)

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send the turn's text as it streams; the audio comes back on the receive task."""
        if context_id == self._failed_context:
            yield None
            return
        try:
            if self._session is None:  # refused at the pipeline's start, or lost: connect for this turn
                await self._open_session()
                self._start_receiving()
            session = self._session
            assert session is not None
            open_utterance = session.open_utterance
            if open_utterance is not None and self._contexts.get(open_utterance) != context_id:
                await session.end()  # a new turn while the last one was still taking text
            if session.open_utterance is None:
                await session.configure(self._speech_settings())  # a settings update applies from here
            self._contexts[await session.text(text)] = context_id
            await self.start_tts_usage_metrics(text)
        except ClientError as exc:
            await self._fail_context(context_id, exc)
        yield None

    async def _fail_context(self, context_id: str, exc: ClientError) -> None:
        """End a turn that cannot speak now with ``exc`` (played in the context, as an utterance's error is): its
        later tokens are dropped, so it fails once, not per token."""
        self._failed_context = context_id
        await self.append_to_audio_context(context_id, self._error_frame(exc))
        await self._end_context(context_id)

    async def _end_context(self, context_id: str) -> None:
        await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
        await self.remove_audio_context(context_id)

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
