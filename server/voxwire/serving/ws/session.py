"""``Session``: the state machine of one ``/v1/tts/stream`` connection, independent of aiohttp.

The handler hands it every client frame (``receive``, ``receive_binary``); it answers through its
``Outbox`` and, when the connection must end (slow reader, idle, a bug), through
``SessionTransport.close``. Per utterance it runs one task that speaks the sentences in order, each
as an engine request whose prompt continues the previous sentence's voice; utterances follow each
other (an utterance's task first waits for the previous one's). Cancellation flows one way:
cancelling a task closes its engine stream, which aborts the request between two engine steps and
frees its slot.

Text buffering: complete sentences (``SentenceSegmenter``) are queued at once; an incomplete rest
is spoken on ``flush``, ``end``, or ``max_buffer_delay_ms`` after the first of its characters
arrived. Sentences without a letter or digit are not spoken (the model has nothing to say for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Protocol

import numpy as np

from voxwire.chunk import Patch
from voxwire.engine import Chunk
from voxwire.errors import InvalidInputError
from voxwire.finish_reason import FinishReason
from voxwire.prompt import VoicePrompt
from voxwire.protocol.wire import (
    Cancel,
    ClientMessage,
    CloseCode,
    Done,
    End,
    Error,
    ErrorCode,
    Flush,
    ProtocolError,
    Ready,
    Segment,
    Start,
    Text,
    decode_client,
)
from voxwire.serving.config import ServerConfig
from voxwire.serving.encoding import INLINE, EncoderPool
from voxwire.serving.keys import ServerState
from voxwire.serving.metrics import Metrics
from voxwire.serving.service import SpeechFailure, SpeechService, UtteranceOptions
from voxwire.serving.voices import VoiceStore
from voxwire.serving.ws.budget import MessageBudget
from voxwire.serving.ws.outbox import Outbox, SlowConsumerError, Transport
from voxwire.serving.ws.utterance import Utterance, UtteranceStatus, continuation, ready_message, resolve_settings
from voxwire.text.normalize import normalize_in_worker, preload_in_worker
from voxwire.text.segmenter import SentenceSegmenter

logger = logging.getLogger(__name__)

MAX_CLOSE_REASON_BYTES = 123
"""RFC 6455 section 5.5: a close frame's reason fits in 123 bytes."""


class SessionTransport(Transport, Protocol):
    """The socket as the session sees it: ``Transport`` plus a close that never hangs."""

    async def close(self, code: CloseCode, reason: str) -> None: ...


class SessionPhase(enum.Enum):
    """The connection's phase; whether an utterance takes text is that utterance's ``UtteranceStatus``."""

    ACTIVE = "active"
    """Messages are accepted, utterances spoken and sent."""
    CLOSED = "closed"
    """The connection is ending: nothing more is accepted, spoken or sent."""


class Session:
    """One connection. Use ``async with``; feed it frames; it never raises for a client's mistake."""

    def __init__(
        self,
        service: SpeechService,
        config: ServerConfig,
        voices: VoiceStore,
        server: ServerState,
        transport: SessionTransport,
        metrics: Metrics | None = None,
        encoders: EncoderPool = INLINE,
    ) -> None:
        self.service = service
        self.encoders = encoders
        self.config = config
        self.voices = voices
        self.server = server
        self.transport = transport
        self.metrics = metrics
        self.outbox = Outbox(transport, config.max_unsent_audio_s)
        self.phase = SessionPhase.ACTIVE
        self._limits = config.engine_config().limits
        self.settings = resolve_settings(
            Start(), voices, service, self._limits, config.max_buffer_delay_ms, config.playback_lead_ms
        )
        self._segmenter = SentenceSegmenter()
        self._utterances: list[Utterance] = []
        """Utterances not ``RELEASED`` yet, oldest first; each one's ``status`` says where it is."""
        self._numbers = itertools.count()
        self._flush_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing: asyncio.Task[None] | None = None
        self._last_activity = time.monotonic()
        self._budget = MessageBudget(config.max_messages_per_s)

    @property
    def _open(self) -> Utterance | None:
        """The utterance taking text, if any."""
        return next((u for u in self._utterances if u.status is UtteranceStatus.OPEN), None)

    @property
    def _live(self) -> list[Utterance]:
        """Utterances not finished yet (taking text or speaking), oldest first."""
        return [u for u in self._utterances if u.status in (UtteranceStatus.OPEN, UtteranceStatus.ENDED)]

    # ---- lifecycle -------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        self._spawn(self.outbox.run())
        self._spawn(self._watch_idle())
        self.outbox.put(self._ready())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live and self.phase is not SessionPhase.CLOSED:
            self._count_dropped("client_gone")
        self.phase = SessionPhase.CLOSED
        tasks = list(self._tasks)
        self._stop_everything()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._closing is not None:
            await self._closing

    def shut(self, code: CloseCode, reason: str, text: str) -> None:
        """End the connection now: stop every utterance and close the socket with ``code``.

        ``reason`` (an ``ErrorCode`` value, or ``client_gone``) starts the close reason and labels the
        dropped-sessions metric.
        """
        if self.phase is SessionPhase.CLOSED:
            return
        self.phase = SessionPhase.CLOSED
        logger.info("closing a WebSocket session: %s: %s", reason, text)
        self._count_dropped(reason)
        self._stop_everything()
        close_reason = f"{reason}: {text}".encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
        self._closing = asyncio.ensure_future(self.transport.close(code, close_reason))

    def _stop_everything(self) -> None:
        """Cancel every task (engine requests are aborted as their streams close) and release the utterances."""
        self._cancel_timer()
        for task in self._tasks:
            task.cancel()
        for utterance in self._utterances:
            utterance.move(UtteranceStatus.RELEASED)
        self._utterances.clear()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, ConnectionError):  # the sender found the socket gone
            self.shut(CloseCode.GOING_AWAY, "client_gone", "the connection broke")
        elif exc is not None:
            logger.error("WebSocket session task failed", exc_info=exc)
            self.shut(CloseCode.INTERNAL_ERROR, ErrorCode.INTERNAL_ERROR.value, "server bug; see the server log")

    async def _watch_idle(self) -> None:
        """Close a connection with no client message and no audio produced for ``idle_timeout_s``."""
        limit = self.config.idle_timeout_s
        while (left := self._last_activity + limit - time.monotonic()) > 0:
            await asyncio.sleep(left)
        self.shut(CloseCode.IDLE_TIMEOUT, ErrorCode.IDLE_TIMEOUT.value, f"nothing sent or spoken for {limit:g} s")

    # ---- client frames ---------------------------------------------------------------------------------------

    def receive(self, data: str) -> None:
        """Handle one text frame; a refusal is answered with an ``error`` and changes nothing else."""
        if not self._admit_message():
            return
        try:
            if len(data.encode(errors="surrogatepass")) > self.config.max_message_bytes:
                raise ProtocolError(
                    ErrorCode.MESSAGE_TOO_LARGE, f"messages are limited to {self.config.max_message_bytes} bytes"
                )
            self._handle(decode_client(data))
        except ProtocolError as exc:
            self._error(exc.code, exc.message)

    def receive_binary(self) -> None:
        if self._admit_message():
            self._error(ErrorCode.BINARY_FRAME, "clients send JSON text frames only; binary frames carry audio")

    def _admit_message(self) -> bool:
        """Whether a client frame is handled: not once closing, and not past the message budget (which closes)."""
        if self.phase is SessionPhase.CLOSED:
            return False
        if not self._budget.spend():
            limit = self.config.max_messages_per_s
            self.shut(CloseCode.RATE_LIMITED, ErrorCode.RATE_LIMITED.value, f"more than {limit:g} messages per second")
            return False
        self._last_activity = time.monotonic()
        return True

    def _handle(self, message: ClientMessage) -> None:
        match message:
            case Start():
                self._start(message)
            case Text():
                self._text(message.text)
            case Flush():
                self._flush()
            case End():
                self._end()
            case Cancel():
                self._cancel()

    def _start(self, start: Start) -> None:
        if self._open is not None:
            raise ProtocolError(ErrorCode.UTTERANCE_IN_PROGRESS, "send end or cancel before changing settings")
        config = self.config
        self.settings = resolve_settings(
            start, self.voices, self.service, self._limits, config.max_buffer_delay_ms, config.playback_lead_ms
        )
        if self.settings.normalize:
            self._spawn(preload_in_worker())  # the first sentence need not wait for the normalizer's load
        self.outbox.put(self._ready())

    def _text(self, text: str) -> None:
        limit = self.config.max_text_chars_per_message
        if len(text) > limit:
            raise ProtocolError(ErrorCode.TEXT_TOO_LONG, f"a text message holds at most {limit} characters")
        if not text:
            return
        utterance = self._open or self._open_utterance()
        limit = self.config.max_text_chars_per_utterance
        if utterance.chars + len(text) > limit:
            raise ProtocolError(ErrorCode.UTTERANCE_TOO_LONG, f"an utterance holds at most {limit} characters")
        utterance.chars += len(text)
        self._queue(utterance, self._segmenter.push(text))
        delay_ms = utterance.settings.max_buffer_delay_ms
        if delay_ms == 0 or not self._segmenter.pending.strip():
            self._flush()
        elif self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(delay_ms / 1000, self._flush)

    def _flush(self) -> None:
        self._cancel_timer()
        if self._open is not None:
            self._queue(self._open, self._segmenter.flush())

    def _end(self) -> None:
        utterance = self._open
        self._flush()
        if utterance is None or utterance.queued == 0:
            raise ProtocolError(ErrorCode.EMPTY_UTTERANCE, "end with nothing to speak: send text first")
        utterance.end()
        self._close_text()

    def _cancel(self) -> None:
        self._close_text()
        for utterance in list(self._live):
            if utterance.task is not None:
                utterance.task.cancel()
            self.outbox.drop(utterance.number)
            self._finish(utterance, FinishReason.CANCELLED)

    def _open_utterance(self) -> Utterance:
        if not self.server.accepting:
            raise ProtocolError(ErrorCode.UNAVAILABLE, "the server is not taking new utterances now")
        limit = self.config.max_queued_utterances
        if len(self._live) >= limit:
            raise ProtocolError(
                ErrorCode.TOO_MANY_UTTERANCES, f"{limit} utterances of this connection are not done yet; wait for one"
            )
        info = self.service.info
        utterance = Utterance(next(self._numbers), self.settings, info.sample_rate, self.config.opus_settings())
        utterance.live.enter_context(self.server.utterance())
        self._utterances.append(utterance)
        return utterance

    def _close_text(self) -> None:
        """The open utterance takes no more text (ended, cancelled or failed); drop what is buffered."""
        self._cancel_timer()
        self._segmenter = SentenceSegmenter()
        if (utterance := self._open) is not None:
            utterance.move(UtteranceStatus.ENDED)

    def _queue(self, utterance: Utterance, sentences: list[str]) -> None:
        for sentence in sentences:
            if not any(char.isalnum() for char in sentence):
                continue
            if utterance.task is None:
                live = self._live
                position = live.index(utterance)
                previous = live[position - 1].task if position else None
                utterance.task = self._spawn(self._speak(utterance, previous))
            utterance.add_segment(sentence)

    def _cancel_timer(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    # ---- speaking --------------------------------------------------------------------------------------------

    async def _speak(self, utterance: Utterance, previous: asyncio.Task[None] | None) -> None:
        """Speak the utterance's sentences in order, each continuing the previous one's voice, then ``done``."""
        if previous is not None:
            await asyncio.wait([previous])
        base = utterance.settings.prompt
        prompt, reason, index = base, FinishReason.STOP, 0
        try:
            while (text := await utterance.next_segment()) is not None:
                spoken = await self._spoken(utterance, text)
                if not any(char.isalnum() for char in spoken):
                    continue  # normalization left nothing to say (e.g. only a code span)
                finish, patches = await self._speak_segment(utterance, index, text, spoken, prompt)
                if finish is FinishReason.LENGTH:
                    reason = FinishReason.LENGTH
                # A segment cut at its length cap does not match its text: continue from the voice alone.
                try:
                    prompt = continuation(base, spoken, patches) if finish is FinishReason.STOP and patches else base
                except InvalidInputError as exc:  # the model produced non-finite latents: never feed them back
                    raise SpeechFailure(ErrorCode.SYNTHESIS_FAILED, str(exc)) from None
                index += 1
            self.outbox.put_audio(utterance.delivery, await self.encoders.finish(utterance.encoder), 0.0)
        except SpeechFailure as exc:
            self._error(exc.code, str(exc), utterance.number)
            reason = FinishReason.ERROR
        except SlowConsumerError as exc:
            self.shut(CloseCode.SLOW_CONSUMER, ErrorCode.SLOW_CONSUMER.value, str(exc))
            return
        self._finish(utterance, reason)

    async def _spoken(self, utterance: Utterance, text: str) -> str:
        """The sentence as it is to be spoken: normalized on the normalization thread when asked for."""
        if not utterance.settings.normalize:
            return text
        try:
            return await normalize_in_worker(text)
        except Exception:  # a normalizer failure costs this sentence its normalization, not the utterance
            logger.exception("normalization failed; speaking the sentence as written")
            return text

    async def _speak_segment(
        self, utterance: Utterance, index: int, text: str, spoken: str, prompt: VoicePrompt | None
    ) -> tuple[FinishReason, list[Patch]]:
        """One sentence through the engine (``spoken``); its audio goes to the outbox as it comes."""
        params = utterance.settings.segment_params(index)
        request_id = self.service.new_request_id("ws")
        if utterance.first_request_at is None:
            utterance.first_request_at = time.monotonic()
        start = utterance.samples
        patches: list[Patch] = []
        final: Chunk | None = None
        # A sentence after the first continues a stream already playing: its deadline is where the
        # listener's buffer runs dry, not a fresh lead after its own first chunk.
        lead, due = utterance.playback_lead_s, utterance.playback_due()
        options = UtteranceOptions(utterance.settings.persona, playback_lead_s=lead, playback_due=due)
        speech = self.service.speak(request_id, spoken, params, prompt, options)
        async with contextlib.aclosing(speech) as stream:
            async for final in stream:
                if final.audio.size:
                    if utterance.samples == start:  # this sentence's first audio
                        self._announce(utterance, index, text, spoken)
                    await self._on_chunk(utterance, final.audio)
                if final.patch is not None:
                    patches.append(final.patch)
        # Failures (refused, engine gone, ended in error or by shutdown) leave as a SpeechFailure.
        assert final is not None and final.finish_reason is not None  # the engine always ends a stream
        return final.finish_reason, patches

    def _announce(self, utterance: Utterance, index: int, text: str, spoken: str) -> None:
        utterance.started += 1
        self.outbox.put(Segment(utterance.number, index, text, utterance.start_sample, spoken))

    async def _on_chunk(self, utterance: Utterance, chunk: np.ndarray) -> None:
        now = self._last_activity = time.monotonic()
        if utterance.first_chunk_at is None:
            utterance.first_chunk_at = now
        utterance.samples += chunk.size
        seconds = chunk.size / utterance.model_rate
        self.outbox.put_audio(utterance.delivery, await self.encoders.encode(utterance.encoder, chunk), seconds)

    def _finish(self, utterance: Utterance, reason: FinishReason) -> None:
        """The utterance is over: queue its ``done`` (built when sent, with what the socket took)."""
        if utterance.status is UtteranceStatus.OPEN:
            self._close_text()
        utterance.move(UtteranceStatus.FINISHED)
        self._last_activity = time.monotonic()
        if self.metrics is not None:
            self.metrics.count_utterance(reason.value)
        self.outbox.put(lambda: self._done(utterance, reason), sent=lambda: self._release(utterance))

    def _release(self, utterance: Utterance) -> None:
        if utterance.status is not UtteranceStatus.RELEASED:  # not if the session stopped meanwhile
            utterance.move(UtteranceStatus.RELEASED)
            self._utterances.remove(utterance)

    def _done(self, utterance: Utterance, reason: FinishReason) -> Done:
        done = utterance.done(reason)
        if self.metrics is not None:
            self.metrics.add_audio(done.audio_s)
            if done.ttfa_s is not None:
                self.metrics.observe_first_audio(done.ttfa_s)
        return done

    def _ready(self) -> Ready:
        return ready_message(self.settings, self.service.info, self.config.opus_settings())

    def _error(self, code: ErrorCode, message: str, utterance: int | None = None) -> None:
        if self.metrics is not None:
            self.metrics.count_error(code.value)
        self.outbox.put(Error(code.value, message, utterance))

    def _count_dropped(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.count_dropped(reason)
